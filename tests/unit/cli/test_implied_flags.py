"""A flag that needs another implies it and says so; only a real conflict is refused (one line
naming the flag and the fix, exit 2); and the DeepSeek-V3 recipe needs no layout aid."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dssup.cli import main

V3 = ["--model", "deepseek-v3", "--gpus", "2048", "--gpu-memory", "H800"]
V3 += ["--global-batch-size", "15360"]
JOB = ["--precision", "fp8", "--dtypes", "moments=bf16"]  # DeepSeek-V3's own precision
PUBLISHED = ["--tp", "1", "--pp", "16", "--ep", "64", "--schedule", "dualpipe", "--zero", "1"]
L8 = ["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "64", "--gpu-memory", "H100"]


def _run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(
    ("args", "implied", "check"),
    [
        (["--recompute-modules", "layernorm,core_attn"], "--recompute selective, implied by "
         "--recompute-modules", ("recompute selective", "layernorm")),
        (["--recompute-num-layers", "2"], "--recompute full, implied by --recompute-num-layers",
         ("recompute full",)),
        (["--offload", "params"], "--zero 3, implied by --offload params", ("ZeRO stage 3",)),
        (["--layers-per-stage", "8,8,8,8"], "--pp 4, implied by the 4 entries",
         ("pipeline schedule 1f1b",)),
    ],
)  # fmt: skip
def test_estimate_implies_and_says_so(
    args: list[str], implied: str, check: tuple[str, ...]
) -> None:
    code, out, err = _run("estimate", *L8, *args)
    assert code in (0, 1), err
    assert implied in out
    for needle in check:
        assert needle in out


@pytest.mark.parametrize(
    ("args", "flag", "fix"),
    [
        (["--recompute", "full", "--recompute-modules", "layernorm"], "--recompute-modules",
         "use --recompute selective"),
        (["--recompute", "none", "--recompute-method", "block"], "--recompute-method",
         "use --recompute full"),
        (["--zero", "1", "--offload", "both"], "--offload", "use --zero 3"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_conflicts_are_one_line_exit_2(command: str, args: list[str], flag: str, fix: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dssup", command, *L8, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dssup: error: {flag}: "), out.stderr
    assert fix in lines[0] and "Traceback" not in out.stderr


def test_plan_says_what_recompute_modules_apply_to() -> None:
    args = ["plan", *L8, "--recompute-modules", "layernorm", "--top", "50", "--json"]
    code, out, err = _run(*args)
    assert code == 0, err
    doc = json.loads(out)
    assert any("what the selective rows recompute" in a for a in doc["assumptions"])
    levels = {c["training"]["recompute"] for c in doc["candidates"]}
    assert "selective" in levels and levels - {"selective"}  # still searched
    sel = [c for c in doc["candidates"] if c["training"]["recompute"] == "selective"]
    assert all(c["training"]["recompute_modules"] == ["layernorm"] for c in sel)


def test_plan_takes_fp8_gemms_with_fp8_caching_and_the_other_way_round() -> None:
    code, out, err = _run("plan", *L8, "--precision", "fp8", "--top", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert any("--compute-dtype fp8, implied by FP8 caching" in a for a in doc["assumptions"])
    code, out, err = _run("plan", *L8, "--compute-dtype", "fp8", "--top", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert any("activations=fp8), implied by --compute-dtype fp8" in a for a in doc["assumptions"])
    assert doc["candidates"][0]["training"]["precision"]["cache_fp8"] is True


def test_deepseek_v3_as_trained_with_no_layout_aid() -> None:
    """Issue 22: `dssup plan` with the model, GPUs, GPU and batch (and the job's own FP8 and BF16
    moments) lists DeepSeek's published layout -- TP1 PP16 DualPipe EP64 ZeRO-1 -- among the
    first rows, under DeepSeek's framework, with the split it chose; `dssup estimate` of that
    layout says it fits, near the limit, and names the split and the framework it implied."""
    code, out, err = _run("plan", *V3, *JOB, "--ep-dispatch", "dedup", "--top", "5", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows = doc["candidates"]
    mine = [
        (i, c)
        for i, c in enumerate(rows, 1)
        if (c["layout"]["tp"], c["layout"]["pp"], c["layout"]["ep"], c["layout"]["schedule"])
        == (1, 16, 64, "dualpipe")
        and (c["training"]["zero_stage"], c["training"]["micro_batch"]) == (1, 1)
    ]
    assert mine, [(c["layout"], c["step_time_s"]) for c in rows]
    _, row = mine[0]
    assert row["training"]["framework"] == "deepseek" and row["layout"]["layers_per_stage"]
    assert any("frameworks megatron, deepseek (no --framework)" in a for a in doc["assumptions"])
    code, out, err = _run("estimate", *V3, *JOB, *PUBLISHED, "--recompute", "selective")
    assert code == 0, err
    assert "FITS" in out and "near the limit" in out
    assert "--framework deepseek, implied by --schedule dualpipe" in out
    assert "layer split 3,4x14,2 (--account-for-embedding-in-pipeline-split" in out
    assert "79.11 GiB that CUDA can allocate" in out
