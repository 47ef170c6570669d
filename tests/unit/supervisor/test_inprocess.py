"""The supervisor's side of in-process recovery: the job's records refine the failure, are
journalled, move the plan to the job's split, and a restarted supervisor replays the same."""

from __future__ import annotations

import json
import time

from dssup.jobreport import InProcessGaveUp, InProcessGuard, InProcessRemedy, append_record
from dssup.supervisor.fastfail import ErrorFileWatch
from dssup.supervisor.inprocess import absorb, guard_gave_up, refine
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import Failure, FailureKind, RankFailure, TrainingPlan
from dssup.supervisor.report import read_attempt_report
from dssup.supervisor.state import replay
from dssup.supervisor.story import story, summarize

P16 = TrainingPlan(micro_batch=16, grad_accum=1, global_batch=32, dp=2, world_size=2)
OOM_TEXT = "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 4194304 bytes"


def _guard(rank: int) -> InProcessGuard:
    return InProcessGuard(rank=rank, sync="deferred", verdict_floor_s=60.0, exit_code=75)


def _remedy(rank: int, old: int, new: int, step: int = 4) -> InProcessRemedy:
    return InProcessRemedy(
        rank=rank, step=step, old_micro_batch=old, old_grad_accum=16 // old, micro_batch=new,
        grad_accum=16 // new, dp=2, global_batch=32, oom_ranks=(1,), oom_phases=("forward",),
        error=OOM_TEXT if rank == 1 else "", lost_s=0.5,
    )  # fmt: skip


def _quit(rank: int, reason: str, error: str = "") -> InProcessGaveUp:
    return InProcessGaveUp(
        rank=rank, step=4, reason=reason, detail="d", phase="forward", micro_batch=1,
        grad_accum=16, dp=2, global_batch=32, oom_ranks=(1,), error=error, exit_code=75,
    )  # fmt: skip


def _attempt_dir(tmp_path, *records):
    d = tmp_path / "attempt-001"
    d.mkdir(parents=True, exist_ok=True)
    for r in records:
        append_record(d / "report.jsonl", r)
    return d


def _journal(tmp_path) -> Journal:
    j = Journal(tmp_path / "run")
    plan = P16.model_dump(mode="json")
    j.append("run-started", run_id="r", command=["torchrun", "t.py"], plan=plan, config={})
    j.append("attempt-started", attempt=1, token="r/1", plan=plan, resume_step=None)
    return j


def test_a_job_without_the_guard_is_left_as_it_was(tmp_path):
    failure = Failure(kind=FailureKind.HOST_OOM, rank=1, message=OOM_TEXT, evidence=("e",))
    attempt = _attempt_dir(tmp_path)
    assert refine(failure, attempt) == failure
    assert refine(None, attempt) is None
    j = _journal(tmp_path)
    before = list(j.records)
    absorb(j, 1, [], replay(j, P16), failure)
    assert j.records == before


def test_a_give_up_with_an_oom_turns_an_unknown_failure_into_that_oom(tmp_path):
    attempt = _attempt_dir(tmp_path, _guard(0), _guard(1), _quit(1, "micro-batch-floor", OOM_TEXT))
    unknown = Failure(
        kind=FailureKind.TRANSIENT, rank=1, message="",
        ranks=(RankFailure(rank=1, exit_code=75), RankFailure(rank=0, exit_code=-15)),
    )  # fmt: skip
    got = refine(unknown, attempt)
    assert got.kind == FailureKind.HOST_OOM and got.phase == "forward"
    assert got.signature == "inprocess-micro-batch-floor"
    assert any("gave up at step 4 (micro-batch-floor" in e for e in got.evidence)


def test_an_armed_guard_that_could_not_act_is_said(tmp_path):
    attempt = _attempt_dir(tmp_path, _guard(0), _guard(1), _quit(0, "peer-lost"))
    killed = Failure(kind=FailureKind.COMM, rank=0, message="Connection closed by peer")
    got = refine(killed, attempt)
    assert got.kind == FailureKind.COMM
    assert any("rank(s) [1] reported nothing" in e for e in got.evidence)
    lone = refine(killed, _attempt_dir(tmp_path / "b", _guard(0), _guard(1)))
    assert any("in-process recovery did not act" in e for e in lone.evidence)


def test_remedies_are_journalled_once_and_the_plan_moves_to_the_jobs_split(tmp_path):
    records = [_guard(0), _guard(1), _remedy(0, 16, 8), _remedy(1, 16, 8)]
    attempt = _attempt_dir(tmp_path, *records)
    report = read_attempt_report(attempt, 32)
    assert report.batch.status == "verified"
    j = _journal(tmp_path)
    state = replay(j, P16)
    absorb(j, 1, report.records, state, None)
    remedies = j.of_type("inprocess-remedy")
    assert len(remedies) == 1 and sorted(remedies[0]["reported_by"]) == [0, 1]
    assert remedies[0]["errors"] == {"1": OOM_TEXT}
    decision = j.last("decision")
    assert decision["action"] == "in-process" and decision["changes"]["micro_batch"] == [16, 8]
    assert (state.plan.micro_batch, state.plan.grad_accum) == (8, 2)
    assert P16.key() in state.tried
    again = replay(j, P16)
    assert again.plan == state.plan and again.tried == state.tried
    assert "in-process: micro_batch 16 -> 8, grad_accum 1 -> 2" in summarize(j).changes
    told = "\n".join(story(j))
    assert "every rank redid the step with micro-batch 16 -> 8" in told


def test_a_give_up_at_the_floor_marks_every_split_tried(tmp_path):
    records = [_remedy(1, 16, 8), _remedy(1, 8, 4), _remedy(1, 4, 2), _remedy(1, 2, 1)]
    records.append(_quit(1, "micro-batch-floor", OOM_TEXT))
    j = _journal(tmp_path)
    failure = Failure(kind=FailureKind.HOST_OOM, rank=1, message=OOM_TEXT)
    state = replay(j, P16)
    absorb(j, 1, [r.model_dump(mode="json") for r in records], state, failure)
    assert (state.plan.micro_batch, state.plan.grad_accum) == (1, 16)
    assert {16, 8, 4, 2, 1} == {
        TrainingPlan.model_validate_json(k).micro_batch for k in state.tried
    }
    gave_up = j.last("inprocess-gave-up")
    assert (gave_up["source"], gave_up["reason"]) == ("job", "micro-batch-floor")
    assert replay(j, P16).tried == state.tried
    assert "in-process recovery gave up (the job: micro-batch-floor)" in "\n".join(story(j))


def test_the_supervisor_says_why_when_no_rank_could(tmp_path):
    j = _journal(tmp_path)
    failure = Failure(kind=FailureKind.TRANSIENT, rank=1, message="", signature="sigkill")
    absorb(j, 1, [_guard(0).model_dump(mode="json")], replay(j, P16), failure)
    gave_up = j.last("inprocess-gave-up")
    assert gave_up["source"] == "supervisor" and gave_up["reason"] == "not-recoverable-in-process"
    assert j.last("decision") is None, "nothing moved: the plan stays"


def test_fast_fail_stops_on_a_guard_that_gave_up_even_for_a_cascade(tmp_path):
    watch = ErrorFileWatch(tmp_path, since=time.time() - 5, every_s=0)
    path = tmp_path / "abc_1" / "attempt_0" / "0" / "error.json"
    path.parent.mkdir(parents=True)
    doc = {"message": {"message": "RuntimeError: Connection closed by peer",
                       "extraInfo": {"py_callstack": "", "timestamp": "1"}}}  # fmt: skip
    path.write_text(json.dumps(doc))
    assert watch.poll() is None and not guard_gave_up(path)
    other = ErrorFileWatch(tmp_path, since=time.time() - 5, every_s=0)
    doc["dssup_inprocess"] = {"reason": "peer-lost", "detail": "d"}
    path.write_text(json.dumps(doc))
    assert guard_gave_up(path)
    verdict = other.poll()
    assert verdict is not None and verdict.rank == 0
