"""``dssup calibrate`` then ``dssup measure --calibration``: real child processes, real files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.procs import dssup_cli

pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.torch]

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": False,
}


def _dssup(*args: str) -> subprocess.CompletedProcess[str]:
    return dssup_cli(*args, timeout=600)


def test_calibrate_then_measure_predicts_the_real_peak(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_LLAMA))
    prof = tmp_path / "eager.json"
    common = ["--model", str(cfg), "--seq-len", "64"]
    out = _dssup("calibrate", *common, "--out", str(prof))
    assert out.returncode == 0, out.stderr
    doc = json.loads(prof.read_text())
    assert doc["kind"] == "eager" and doc["dense"] is not None and doc["moe"] is None
    out = _dssup("measure", *common, "-b", "16", "--calibration", str(prof), "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["mode"] == "real" and abs(res["profiler_peak_bytes"] - res["peak_bytes"]) <= 4096
    assert -0.02 <= res["error"] <= 0.04, res
    assert res["phase"] == "backward" and res["predicted_phase"] == "forward-backward"
    # rank 0 of two data-parallel ranks (fake process group), ZeRO-2, optimizer on the host
    sharded = ["--dp", "2", "--zero", "2", "--offload-optimizer"]
    out = _dssup("measure", *common, "-b", "16", *sharded, "--calibration", str(prof), "--json")
    assert out.returncode == 0, out.stderr
    dp = json.loads(out.stdout)
    assert dp["run"]["zero_stage"] == 2 and dp["peak_bytes"] < res["peak_bytes"]
    assert -0.02 <= dp["error"] <= 0.04, dp


def test_bad_layer_count_is_one_line_exit_2() -> None:
    out = _dssup("measure", "--model", "llama-3-8b", "--layers", "0")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "--layers" in out.stderr
