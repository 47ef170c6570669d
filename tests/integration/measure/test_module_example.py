"""examples/custom_block: a block no library has, calibrated with ``--module``, then estimated.

The example's factory builds a parallel attention + MLP decoder; ``dssup calibrate --module``
traces it (child process, FakeTensorMode), ``dssup measure --module`` runs it for real at a
micro-batch and length the calibration never traced and checks the prediction, and ``dssup
estimate`` composes the profile with TP 2 and ZeRO from the example's config.json.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.procs import dssup_cli

pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
MODULE = ["--module", "custom_block.model:factory", "--module-path", str(ROOT / "examples")]
CONFIG = str(ROOT / "examples" / "custom_block" / "config.json")


def _dssup(*args: str) -> subprocess.CompletedProcess[str]:
    return dssup_cli(*args, timeout=900)


def test_module_factory_calibrates_measures_and_estimates(tmp_path: Path) -> None:
    prof = tmp_path / "block.json"
    out = _dssup("calibrate", *MODULE, "--seq-len", "64", "--dtype", "amp", "--kernels", "cpu",
                 "--out", str(prof))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "4 dense blocks in blocks" in out.stdout, out.stdout
    doc = json.loads(prof.read_text())
    assert doc["provenance"]["source"] == "module" and doc["worst_check"] < 0.001
    for recompute in ("none", "full"):
        out = _dssup(
            "measure", *MODULE, "--seq-len", "80", "-b", "5", "--dtype", "amp",
            "--recompute", recompute, "--module-config", CONFIG, "--calibration", str(prof),
            "--json",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout)
        assert -0.02 <= res["error"] <= 0.04, res
        assert (res["phase"] == "optimizer") == (res["predicted_phase"] == "optimizer-step")
    out = _dssup(
        "estimate", "--model", CONFIG, "--calibration", str(prof), "--seq-len", "80",
        "--micro-batch", "5", "--tp", "2", "--dp", "2", "--zero", "1", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    est = json.loads(out.stdout)
    assert any(a.startswith("traced (module custom_block") for a in est["assumptions"])
    assert any("/ TP=2" in a for a in est["assumptions"])


def test_the_docstring_commands_in_bf16(tmp_path: Path) -> None:
    """model.py's own example (bf16: the factory's model is cast tensor by tensor under
    FakeTensorMode, where ``Module.to`` cannot swap fake parameters), at a shorter length."""
    prof = tmp_path / "block.json"
    out = _dssup("calibrate", *MODULE, "--seq-len", "32", "--dtype", "bf16", "--out", str(prof))
    assert out.returncode == 0, out.stderr
    out = _dssup(
        "estimate", "--model", CONFIG, "--calibration", str(prof), "--seq-len", "32",
        "--micro-batch", "8", "--tp", "2", "--zero", "1", "--dp", "4", "--gpu-memory", "24GiB",
        "--dtypes", "weights=bf16,grads=bf16,master=none,moments=bf16",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "FITS" in out.stdout and "model states counted" not in out.stdout
