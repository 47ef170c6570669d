"""Checkpoint conversion round-trips with real DeepSpeed under torchrun on CPU (gloo).

Four launches (about two minutes on an idle 2-core box) cover stage 1→2 (native and forced universal),
1→3, 2→3, 3→1, 0→3 at two ranks, 1→2 and 1→3 into engines whose JSON dssup rewrote for
optimizer (and parameter) offload, then DP 2→1 and DP 1→2, then bf16 1→3 and 3→2. For every case: fp32 weights and both Adam
moments of every parameter are bit-identical after the load to what was saved, the step and
sample counters are restored, and the next step's loss equals the loss of the engine that
saved the checkpoint and simply went on (the unconverted control).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ds_launch import needs_deepspeed, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.slow, needs_deepspeed]

WORKER = Path(__file__).with_name("roundtrip_worker.py")
PHASES = (("stages", 2), ("shrink", 1), ("grow", 2), ("bf16", 2))
EXPECTED = {
    "stage 1->2": "direct",
    "stage 1->2 (forced universal)": "universal",
    "stage 1->3": "universal",
    "stage 2->3": "universal",
    "stage 3->1": "universal",
    "stage 0->3": "universal",
    "dp 2->1 (stage 2)": "universal",
    "dp 1->2 (stage 1)": "universal",
    "stage 1->2 + offload optimizer": "direct",
    "stage 1->3 + offload all": "universal",
    "bf16 stage 1->3": "universal",
    "bf16 stage 3->2": "universal",
}
OFFLOAD = {  # what the engine reports after loading with the JSON dssup wrote
    "stage 1->2 + offload optimizer": ("cpu", "none"),
    "stage 1->3 + offload all": ("cpu", "cpu"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("roundtrip")
    out: dict[str, dict[str, Any]] = {}
    for phase, nproc in PHASES:
        done = torchrun(nproc, WORKER, "--phase", phase, "--work", str(work))
        assert done.returncode == 0, done.stderr[-4000:]
        for case in json.loads((work / f"results-{phase}.json").read_text()):
            out[case["case"]] = case
    return out


def test_every_case_ran(results: dict[str, dict[str, Any]]) -> None:
    assert set(results) == set(EXPECTED)


@pytest.mark.parametrize("case", list(EXPECTED))
def test_state_and_next_loss_survive(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert r["resume"]["kind"] == EXPECTED[case], r["resume"]["reason"]
    assert r["resume"]["keeps_optimizer"] is True
    assert r["compared"] == 24  # 8 parameters x (fp32, exp_avg, exp_avg_sq)
    assert r["weights_equal"], r["mismatch"]
    assert r["moments_equal"], r["mismatch"]
    assert (r["global_steps"], r["global_samples"]) == (2, 16)
    assert r["loss"] == r["control_loss"]


def test_native_saving_after_a_universal_load(results: dict[str, dict[str, Any]]) -> None:
    resave = results["stage 1->3"]["resave"]
    info = resave["info"]
    assert info["complete"] and not info["universal"], info
    assert (info["zero_stage"], info["dp_world_size"], info["global_steps"]) == (3, 2, 3)
    assert resave["weights_equal"] and resave["moments_equal"], resave["mismatch"]


@pytest.mark.parametrize("case", list(OFFLOAD))
def test_offload_reaches_the_engine(results: dict[str, dict[str, Any]], case: str) -> None:
    engine = results[case]["engine"]
    assert (engine["offload_optimizer"], engine["offload_param"]) == OFFLOAD[case]
    assert engine["zero_stage"] == int(case.split("->")[1][0])


def test_conversion_never_touches_the_source(results: dict[str, dict[str, Any]]) -> None:
    for r in results.values():
        if r["resume"]["kind"] != "universal":
            continue
        source = Path(r["resume"]["source"])
        assert not (source / "zero").exists()
        assert not (source.parent / "latest_universal").exists()
        assert Path(r["resume"]["load_dir"]) != source.parent
