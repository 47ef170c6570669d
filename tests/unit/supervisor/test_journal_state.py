"""Journal atomicity and the state a restarted supervisor rebuilds from it."""

import json
import os

import pytest

from dssup.errors import JournalError
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.state import replay
from dssup.supervisor.story import story, summarize

P16 = TrainingPlan(micro_batch=16, grad_accum=1, global_batch=32, dp=2, world_size=2)
P8 = P16.model_copy(update={"micro_batch": 8, "grad_accum": 2})
OOM = Failure(kind=FailureKind.HOST_OOM, rank=1, message="DefaultCPUAllocator: can't allocate")


def _dump(p):
    return p.model_dump(mode="json")


def _story_journal(path):
    j = Journal(path)
    j.append("run-started", run_id="r", command=["torchrun", "t.py"], plan=_dump(P16), config={})
    j.append("attempt-started", attempt=1, token="r/1", plan=_dump(P16), resume_step=None)
    j.append(
        "attempt-ended",
        attempt=1,
        exit_code=1,
        duration_s=10.0,
        failure=OOM.model_dump(mode="json"),
        checkpoint_step=4,
    )
    j.append(
        "decision",
        action="remedy",
        step="halve-micro-batch",
        reason="r",
        plan=_dump(P8),
        changes={"micro_batch": [16, 8], "grad_accum": [1, 2]},
        after_attempt=1,
    )
    return j


def test_appends_are_whole_lines_and_survive_reopen(tmp_path):
    j = _story_journal(tmp_path)
    again = Journal(tmp_path)
    assert [r["seq"] for r in again.records] == [0, 1, 2, 3]
    assert all(json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines())
    assert j.next_attempt() == 2 and again.open_attempt() is None


def test_a_crash_during_write_leaves_the_old_journal(tmp_path, monkeypatch):
    j = _story_journal(tmp_path)
    before = (tmp_path / "journal.jsonl").read_bytes()

    def boom(*_a):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        j.append("attempt-started", attempt=2, token="r/2", plan=_dump(P8))
    assert (tmp_path / "journal.jsonl").read_bytes() == before
    assert not list(tmp_path.glob(".journal.*"))


def test_corrupt_journal_is_an_error(tmp_path):
    (tmp_path / "journal.jsonl").write_text('{"seq": 0}\n{not json\n')
    with pytest.raises(JournalError, match="not JSON"):
        Journal(tmp_path)


def test_replay_rebuilds_plan_tried_and_progress(tmp_path):
    j = _story_journal(tmp_path)
    j.append("attempt-started", attempt=2, token="r/2", plan=_dump(P8), resume_step=4)
    assert j.open_attempt()["attempt"] == 2
    state = replay(j, P16)
    assert state.plan == P8
    assert state.tried == {P16.key()}
    assert state.attempts == 1 and state.best_step == 4 and state.no_progress == 0


def test_interrupted_attempts_do_not_mark_a_plan_as_failed(tmp_path):
    j = _story_journal(tmp_path)
    j.append("attempt-started", attempt=2, token="r/2", plan=_dump(P8), resume_step=4)
    lost = Failure(kind=FailureKind.INTERRUPTED, message="supervisor was killed")
    j.append(
        "attempt-ended",
        attempt=2,
        exit_code=None,
        failure=lost.model_dump(mode="json"),
        checkpoint_step=6,
    )
    state = replay(j, P16)
    assert P8.key() not in state.tried and state.plan == P8 and state.attempts == 2


def test_story_and_summary(tmp_path):
    j = _story_journal(tmp_path)
    j.append(
        "attempt-started",
        attempt=2,
        token="r/2",
        plan=_dump(P8),
        resume_step=4,
        resume_from="/c/step_4",
        relaunch_overhead_s=0.05,
    )
    j.append(
        "attempt-ended", attempt=2, exit_code=0, duration_s=9.0, failure=None, checkpoint_step=8
    )
    j.append(
        "run-ended",
        outcome="succeeded",
        reason="training finished",
        exit_code=0,
        final_plan=_dump(P8),
    )
    s = summarize(j)
    # dssup's own plans kept 32, but no job-report backs it: never "unchanged", "unverified"
    assert (s.outcome, s.attempts, s.global_batch_status) == ("succeeded", 2, "unverified")
    assert s.changes == ["halve-micro-batch: micro_batch 16 -> 8, grad_accum 1 -> 2"]
    assert s.time_lost_s == pytest.approx(10.05)
    text = "\n".join(story(j))
    assert (
        "Attempt 2: micro-batch 8, accumulation 2, global batch 32, resuming from /c/step_4 (step 4)"
        in text
    )
    assert (
        "global batch 32 planned; not reported by the job in attempt(s) [1, 2]: unverified" in text
    )
    assert "unchanged" not in text


def test_a_stop_request_before_launch_launches_nothing(tmp_path):
    import signal

    from dssup.supervisor import RemedyPlanner, Supervisor, SupervisorConfig, parse_command

    config = SupervisorConfig(
        run_id="stop", run_dir=tmp_path, command=["torchrun", "x.py"], initial_plan=P16
    )
    sup = Supervisor(config, parse_command(["torchrun", "x.py"], env={}), RemedyPlanner.default())
    sup.request_stop(signal.SIGTERM)
    outcome = sup.run()
    assert outcome.exit_code == 128 + signal.SIGTERM
    types = [r["type"] for r in outcome.journal.records]
    assert types == ["run-started", "run-ended"]
    assert outcome.journal.records[-1]["outcome"] == "interrupted"
