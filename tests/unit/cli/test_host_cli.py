"""``--host-memory`` and ``--gpus-per-node`` as a user runs them: real processes."""

from __future__ import annotations

import json
import subprocess

from tests.procs import dssup_cli

OFFLOADED = ["--model", "llama-3-8b", "--gpus", "8", "--zero", "3", "--offload", "optimizer"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return dssup_cli(*args, timeout=120)


def test_fits_the_gpu_but_not_the_host_does_not_fit() -> None:
    out = run("estimate", *OFFLOADED, "--gpu-memory", "H100", "--host-memory", "128GiB")
    assert out.returncode == 1, out.stderr
    assert "GPU 79.20 GiB: FITS" in out.stdout
    assert "host 128.00 GiB: DOES NOT FIT" in out.stdout
    assert "GPUs per node: 8 (DGX H100 / DGX H200, the H100-SXM-80GB reference node)" in out.stdout
    doc = json.loads(run("estimate", *OFFLOADED, "--gpu-memory", "80GiB", "--json").stdout)
    assert doc["gpus_per_node"] == 8 and doc["host_fits"] is None  # no GPU named: no node
    assert doc["host_bytes_per_node"] == 8 * doc["stages"][0]["host_bytes"] > 0
    assert any(a.startswith("host memory NOT CHECKED") for a in doc["assumptions"])
    st = doc["stages"][0]
    assert sum(st["host_terms"].values()) == st["host_bytes"]
    ok = run("estimate", *OFFLOADED, "--gpu-memory", "l40s", "--host-memory", "2TiB")
    assert ok.returncode == 0 and "host 2048.00 GiB: FITS" in ok.stdout


def test_gpus_per_node_and_the_build_on_the_host() -> None:
    four = json.loads(
        run("estimate", *OFFLOADED, "--gpus-per-node", "4", "--host-load-dtype", "bf16",
            "--json").stdout
    )  # fmt: skip
    st = four["stages"][0]
    assert four["gpus_per_node"] == 4 and st["host_init_bytes"] > 0
    assert four["host_bytes_per_node"] == 4 * max(st["host_bytes"], st["host_init_bytes"])
    bad = run("estimate", *OFFLOADED, "--host-memory", "2048")
    assert bad.returncode == 2 and "--host-memory: 2048: did you mean 2048GiB?" in bad.stderr


def test_plan_drops_what_the_host_cannot_hold() -> None:
    args = ["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "64", "--gpu-memory",
            "40GiB", "--zero-stages", "2,3", "--seq-len", "2048", "--exhaustive"]  # fmt: skip
    out = run("plan", *args, "--host-memory", "64GiB")
    assert "configs fit the GPU but not the host memory" in out.stdout
    assert "host/node" in out.stdout and "GPUs per node: 8 (default" in out.stdout
    doc = json.loads(run("plan", *args, "--host-memory", "64GiB", "--json").stdout)
    assert doc["host_limited"] > 0 and doc["candidates"]
    assert all(c["host_bytes_per_node"] <= 64 << 30 for c in doc["candidates"])
    free = json.loads(run("plan", *args, "--json").stdout)
    assert free["fitting"] == doc["fitting"] + doc["host_limited"]


def test_host_memory_is_a_verdict_by_default_from_the_reference_node() -> None:
    """No --host-memory: the GPU's reference node (a DGX A100 has 1 TiB) is the host, printed
    as an assumption; a config whose offload needs more does not fit (exit 1) and the answer
    names the terms that need the memory."""
    args = ["--model", "llama-3-70b", "--gpus", "8", "--zero", "3", "--offload", "both",
            "--global-batch-size", "64", "--recompute", "full", "--gpu-memory", "A100-80GB"]  # fmt: skip
    out = run("estimate", *args)
    assert out.returncode == 1, out.stdout
    assert "GPU 79." in out.stdout and ": FITS" in out.stdout  # the GPU alone would take it
    assert "host 1024.00 GiB: DOES NOT FIT" in out.stdout
    terms = next(x for x in out.stdout.splitlines() if x.startswith("host per node by term"))
    for term in ("optimizer offload", "pinned buffers", "parameter offload"):
        assert term in terms
    assert (
        "host memory 1,024 GiB per node (DGX A100, the A100-SXM4-80GB reference node, "
        "assumed; give --host-memory to state yours)" in out.stdout
    )
    doc = json.loads(run("estimate", *args, "--json").stdout)
    assert doc["host_fits"] is False and doc["fits"] is False
    assert doc["host_memory_source"].startswith("DGX A100")
    stated = run("estimate", *args, "--host-memory", "4TiB")
    assert stated.returncode == 0 and "host 4096.00 GiB: FITS" in stated.stdout
    assert "assumed; give --host-memory" not in stated.stdout


def test_plan_checks_the_reference_node_by_default() -> None:
    """The issue's example: every row needed 1,774-2,169 GiB per node on a 1 TiB DGX A100 and
    was listed with exit 0; now none is, the reason is printed and the exit status is 1."""
    args = ["--model", "llama-3-70b", "--gpus", "8", "--global-batch-size", "64",
            "--gpu-memory", "A100-40GB"]  # fmt: skip
    out = run("plan", *args)
    assert out.returncode == 1, out.stdout
    assert "fit the GPU but not the host memory (the least needs 1774" in out.stdout
    assert "host memory 1,024 GiB per node (DGX A100" in out.stdout
    roomy = run("plan", *args, "--host-memory", "4TiB", "--top", "3")
    assert roomy.returncode == 0 and "host/node" in roomy.stdout
