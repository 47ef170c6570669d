"""``dssup calibrate`` on an MLA model (DeepSeek-V2-Lite's shipped config, cut to its first two
blocks: the dense one and a MoE one) traces CUDA's attention kernel by default: the report names
it, the profile keeps no s x s tensor, and a CPU check of such a profile is refused with the flag
that makes one (issue 36). What the kernels change is per layer, and every trace costs seconds of
FakeTensor dispatch, hence two blocks and one recompute level; the whole model is calibrated
from its Hub id by the README's example, which the docs tests run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dssup import modelzoo
from tests.procs import dssup_cli

pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

STEP = ["--dtype", "bf16", "--seq-len", "256"]
TRACE = [*STEP, "--recompute-levels", "none"]


def _dssup(*args: str) -> subprocess.CompletedProcess[str]:
    return dssup_cli(*args, timeout=900)


def test_cuda_kernels_by_default_and_cpu_on_request(tmp_path: Path) -> None:
    entry = modelzoo.find("deepseek-ai/DeepSeek-V2-Lite")
    assert entry is not None
    cfg = modelzoo.load_config(entry)
    (tmp_path / "v2-lite-2.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}))
    model = str(tmp_path / "v2-lite-2.json")
    cuda, cpu = tmp_path / "cuda.json", tmp_path / "cpu.json"
    out = _dssup("calibrate", "--hf", model, *TRACE, "--out", str(cuda))
    assert out.returncode == 0, out.stderr
    assert (
        "attention as CUDA runs it (PyTorch's SDPA dispatch): memory-efficient kernel "
        "(not flash: head dims q/k/v 192/192/128)" in out.stdout
    )
    assert "_safe_softmax" not in out.stdout
    out_cpu = _dssup("calibrate", "--hf", model, *TRACE, "--kernels", "cpu", "--out", str(cpu))
    assert out_cpu.returncode == 0, out_cpu.stderr
    assert "not what a GPU keeps" in out_cpu.stdout
    est = {}
    for name, prof in (("cuda", cuda), ("cpu", cpu)):
        res = _dssup("estimate", "--model", model, "--calibration", str(prof), "--seq-len", "4096",
                     "--json")  # fmt: skip
        assert res.returncode == 0, res.stderr
        est[name] = json.loads(res.stdout)["stages"][0]["bytes"]["activations_per_micro_batch"]
    # the CPU's math path keeps b*h*s*s FP32 probabilities per layer: 16 heads x 4096^2 x 4 B
    # = 1 GiB per layer, 2 layers; CUDA's memory-efficient kernel keeps none of it
    assert est["cpu"] - est["cuda"] >= 2 * (1 << 30)
    check = _dssup("measure", "--hf", model, *STEP, "-b", "2", "--calibration", str(cuda))
    assert check.returncode == 2
    assert check.stderr.strip().endswith(
        "calibrate again with --kernels cpu for a check on this CPU"
    )
