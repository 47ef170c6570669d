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
    doc = json.loads(run("estimate", *OFFLOADED, "--gpu-memory", "H100", "--json").stdout)
    assert doc["gpus_per_node"] == 8 and doc["host_fits"] is None
    assert doc["host_bytes_per_node"] == 8 * doc["stages"][0]["host_bytes"] > 0
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
    assert "host/node" in out.stdout and "host per node: 8 GPUs per node (default" in out.stdout
    doc = json.loads(run("plan", *args, "--host-memory", "64GiB", "--json").stdout)
    assert doc["host_limited"] > 0 and doc["candidates"]
    assert all(c["host_bytes_per_node"] <= 64 << 30 for c in doc["candidates"])
    free = json.loads(run("plan", *args, "--json").stdout)
    assert free["fitting"] == doc["fitting"] + doc["host_limited"]
