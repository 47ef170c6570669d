"""``dssup calibrate --hf`` end to end, and a CI subset of the transformers accuracy report.

The subset calibrates one group of bench/hf_measured.json with the report's grid (micro-batches
3, 5, 6 at lengths 96, 160, 224; none of them measured), predicts that group's measured runs
through ``dssup.memory.estimate``, and re-measures three of them for real: the stored dataset
must equal a fresh measurement to the byte (the steps are deterministic), and the prediction
must be within -2 %/+4 % with the phase right, remedy savings within 5 %.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: bench/

from bench.hf_accuracy import (
    CHECK_SEQ_LEN,
    MICRO_BATCHES,
    SEQ_LENS,
    group_of,
    remedies,
    rows,
)
from bench.hf_dataset import row, source
from dssup.runtime.traced import Knobs
from dssup.runtime.traced.calibrate import CalibrationRequest, calibrate
from tests.procs import dssup_cli

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "bench" / "hf_models" / "llama-gqa-tiny.json"
GROUP = "qwen2-moe-tiny/bf16/eager"
REMEASURED = [f"{GROUP}/nockpt/b1/s256", f"{GROUP}/nockpt/b8/s512", f"{GROUP}/ckpt/b4/s256"]


def _dssup(*args: str) -> subprocess.CompletedProcess[str]:
    return dssup_cli(*args, timeout=900)


def test_calibrate_then_measure_and_estimate_other_sizes(tmp_path: Path) -> None:
    prof = tmp_path / "llama.json"
    common = ["--hf", str(LLAMA), "--layers", "2", "--dtype", "bf16", "--attn", "eager"]
    out = _dssup("calibrate", *common, "--seq-len", "64", "--out", str(prof))
    assert out.returncode == 0, out.stderr
    assert "2 dense blocks in model.layers" in out.stdout and "peak RSS" in out.stdout
    doc = json.loads(prof.read_text())
    assert (
        doc["kind"] == "traced" and doc["version"] == 2 and set(doc["levels"]) == {"none", "full"}
    )
    assert doc["provenance"]["versions"]["transformers"] == "5.23.0"
    # a micro-batch and a length the calibration never traced
    out = _dssup("measure", *common, "--seq-len", "80", "-b", "5", "--calibration", str(prof),
                 "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert -0.02 <= res["error"] <= 0.04, res
    assert (res["phase"] == "optimizer") == (res["predicted_phase"] == "optimizer-step")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**json.loads(LLAMA.read_text()), "num_hidden_layers": 2}))
    out = _dssup("estimate", "--model", str(cfg), "--calibration", str(prof), "--seq-len", "80",
                 "--micro-batch", "5", "--tp", "2", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assumptions = " ".join(json.loads(out.stdout)["assumptions"])
    assert "traced" in assumptions and "modelled" in assumptions
    wrong = _dssup("estimate", "--model", "llama-3-8b", "--calibration", str(prof))
    assert wrong.returncode == 2 and "calibrate the model you estimate" in wrong.stderr
    level = _dssup("estimate", "--model", str(cfg), "--calibration", str(prof), "--recompute",
                   "selective")  # fmt: skip
    assert level.returncode == 2 and "selective is not in the profile" in level.stderr


# qwen2-moe bf16 eager: MoE dispatch, s^2 scores; llama amp sdpa: autocast's cached weight
# casts, freed when autocast is left (per block: the traced model has fewer blocks)
@pytest.mark.parametrize("group", [GROUP, "llama-gqa-tiny/amp/sdpa"])
@pytest.mark.timeout(900)
def test_ci_subset_of_the_transformers_accuracy_report(group: str) -> None:
    measured = json.loads((ROOT / "bench" / "hf_measured.json").read_text())
    mine = {"runs": [r for r in measured["runs"] if group_of(r) == group]}
    assert len(mine["runs"]) == 16  # 2 recompute x 4 micro-batches x 2 lengths
    model, dtype, attention = group.split("/")
    req = CalibrationRequest(
        source=source(model),
        knobs=Knobs(dtype=dtype, attention=attention),
        micro_batches=MICRO_BATCHES,
        seq_lens=SEQ_LENS,
        check_seq_len=CHECK_SEQ_LEN,
    )
    profile = calibrate(req)
    assert profile.blocks == ({"moe": 4} if group == GROUP else {"dense": 4})
    assert profile.worst_check < 0.001
    rs = rows(mine, {group: profile})
    fb = [r for r in rs if r["phase"] != "optimizer"]
    assert fb and all(-0.02 <= r["error"] <= 0.04 for r in fb), [
        (r["id"], r["error"]) for r in fb if not -0.02 <= r["error"] <= 0.04
    ]
    assert all(
        (r["phase"] == "optimizer") == (r["predicted_phase"] == "optimizer-step") for r in rs
    )
    rem = remedies(rs)
    assert {x["remedy"] for x in rem} == {"micro-batch halved", "checkpointing on"}
    assert all(x["ok"] for x in rem), [x for x in rem if not x["ok"]]
    by_id = {r["id"]: r for r in mine["runs"]}
    for rid in REMEASURED if group == GROUP else []:
        stored = by_id[rid]
        fresh = row(rid, model, Knobs.model_validate(stored["knobs"]))
        assert (fresh["peak_bytes"], fresh["phase"]) == (stored["peak_bytes"], stored["phase"])
