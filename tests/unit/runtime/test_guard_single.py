"""``StepGuard`` in one process against real allocator failures (``memory_cap``), run once in a
subprocess (the cap is per process): ``tests/fixtures/inprocess/single_guard.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dssup.jobreport import InProcessGaveUp, InProcessGuard, InProcessRemedy, read_report
from tests.memprobe import MALLOC

pytestmark = [pytest.mark.torch]
SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "inprocess" / "single_guard.py"


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict], Path]:
    report = tmp_path_factory.mktemp("guard") / "report.jsonl"
    env = {**os.environ, **MALLOC}  # large blocks mapped from the start, one arena: a tight cap
    for key in ("RANK", "WORLD_SIZE", "DSSUP_ATTEMPT", "DSSUP_VERDICT_TIMEOUT_S"):
        env.pop(key, None)
    res = subprocess.run(
        [sys.executable, str(SCRIPT), str(report)],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    return {d["scenario"]: d for d in lines}, report


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_an_oom_is_redone_at_the_next_split_with_the_same_weights(outcome, phase):
    got = outcome[0][phase]
    assert got["tries"] == [2, 1], "one redo, and the finer split persists"
    assert (got["micro_batch"], got["grad_accum"]) == (8, 2)
    assert got["rel"] < 1e-5


def test_the_floor_gives_up_and_says_why(outcome):
    assert outcome[0]["floor"]["raised"] == "micro-batch-floor"
    quits = read_report(outcome[1]).of(InProcessGaveUp)
    floor = next(q for q in quits if q.reason == "micro-batch-floor")
    assert (floor.micro_batch, floor.grad_accum, floor.exit_code) == (8, 2, 75)
    assert floor.phase in {"forward", "backward"} and "can't allocate memory" in floor.error


def test_an_oom_in_the_optimizer_step_is_not_redone(outcome):
    assert outcome[0]["optimizer"]["raised"] == "oom-in-optimizer-step"


def test_a_user_error_propagates_unchanged(outcome):
    assert outcome[0]["user-error"]["raised"] == "RuntimeError"
    assert "is invalid for input" in outcome[0]["user-error"]["message"]


def test_the_rng_is_rewound_for_the_redo(outcome):
    first, redo = outcome[0]["rng"]["draws"]
    assert first == redo


def test_mean_losses_of_a_dict_batch_are_weighted_by_share(outcome):
    assert outcome[0]["dict-mean"]["rel"] < 1e-5


def test_a_batch_that_is_not_the_share_is_refused(outcome):
    assert "share of global batch 16 is 16" in outcome[0]["wrong-share"]["raised"]


def test_records(outcome):
    report = read_report(outcome[1])
    assert not report.problems
    assert {g.sync for g in report.of(InProcessGuard)} == {"local"}
    remedy = report.of(InProcessRemedy)[0]
    assert (remedy.old_micro_batch, remedy.micro_batch, remedy.oom_ranks) == (16, 8, (0,))
    assert remedy.consistent and remedy.global_batch == 16


def test_each_oom_is_reported_in_the_phase_its_budget_places_it(outcome):
    forward, backward = read_report(outcome[1]).of(InProcessRemedy)[:2]
    assert (forward.oom_phases, backward.oom_phases) == (("forward",), ("backward",))
    assert forward.error.startswith("RuntimeError") and "can't allocate" in backward.error
