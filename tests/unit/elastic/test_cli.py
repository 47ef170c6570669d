"""``dssup plan-elastic``, ``dssup plan --nnodes`` and the multi-node checks of ``dssup run``."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dssup.cli import main

BASE = ["--global-batch-size", "1024", "--nnodes", "4:16", "--nproc-per-node", "8"]


def _run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_table_lists_compatible_node_counts() -> None:
    code, out, _ = _run("plan-elastic", *BASE)
    assert code == 0
    assert "3 of 13 node counts keep the batch exact" in out
    assert "incompatible: DP 40 does not divide the global batch 1024" in out


def test_json_rows_keep_the_batch_and_plan_flag_agrees() -> None:
    gpu = ["--model", "llama-3-8b", "--gpu-memory", "H100,A100-40GB", "--seq-len", "2048"]
    code, out, _ = _run("plan-elastic", *BASE, *gpu, "--json")
    assert code == 0
    doc = json.loads(out)
    for row in doc["rows"]:
        for s in row["splits"]:
            assert s["micro_batch"] * s["grad_accum"] * row["dp"] == 1024
        assert [f["gpu"] for f in row["memory"]] == (["H100", "A100-40GB"] if row["splits"] else [])
    code2, out2, _ = _run("plan", *BASE, *gpu, "--json")
    assert code2 == 0 and json.loads(out2) == doc


def test_nothing_compatible_exits_1_and_bad_range_exits_2() -> None:
    code, out, _ = _run(
        "plan-elastic", "--global-batch-size", "7", "--nnodes", "2", "--nproc-per-node", "2"
    )
    assert code == 1 and "0 of 1 node counts" in out
    code, _, err = _run("plan-elastic", "--global-batch-size", "8", "--nnodes", "4:2")
    assert code == 2 and err.startswith("dssup: error: --nnodes:") and len(err.splitlines()) == 1


def test_multi_node_run_refuses_a_static_rendezvous(tmp_path: Path) -> None:
    cmd = ["torchrun", "--nnodes", "1:2", "--nproc-per-node", "1", "train.py"]
    code, _, err = _run("run", "--shared-dir", str(tmp_path), "--node-rank", "0", "--", *cmd)
    assert code == 2 and "rendezvous backend 'static'" in err


def test_multi_node_run_needs_a_node_rank(tmp_path: Path) -> None:
    cmd = ["torchrun", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
           "127.0.0.1:1", "train.py"]  # fmt: skip
    code, _, err = _run(
        "run", "--global-batch-size", "8", "--shared-dir", str(tmp_path), "--", *cmd
    )
    assert code == 2 and "--node-rank" in err


def test_rows_near_the_limit_say_so_and_the_capacity_is_an_assumption() -> None:
    """``plan --nnodes``: a cheapest row within the memory model's uncertainty of the GPU is
    marked, the band is named once with its source, and each GPU's capacity and the margin
    (none) are printed as assumptions; with room to spare nothing is marked."""
    one = ["--global-batch-size", "1024", "--nnodes", "4", "--nproc-per-node", "8"]
    gpu = ["--model", "llama-3-8b", "--seq-len", "4096"]
    code, out, _ = _run("plan", *one, *gpu, "--gpu-memory", "67GiB")
    assert code == 0
    (row,) = [line for line in out.splitlines() if "67GiB: micro" in line]
    assert row.endswith("GiB, near the limit)")
    assert "near the limit: within the memory model's 5.0% uncertainty" in out
    assert "docs/memory-model.md" in out
    assert "assumption: GPU memory 67GiB as given" in out and "; no margin" in out
    code, out, _ = _run("plan-elastic", *one, *gpu, "--gpu-memory", "H100")
    assert code == 0 and "near the limit" not in out
    assert "assumption: GPU memory H100-SXM-80GB: 79.20 GiB that CUDA can allocate" in out
