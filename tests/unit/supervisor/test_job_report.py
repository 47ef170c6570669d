"""The job-side report: the wire format both sides share, and the supervisor's batch verdict."""

from __future__ import annotations

import json
import multiprocessing
from typing import Literal

import pytest
from pydantic import Field

from dssup.jobreport import (
    BatchChanged,
    Completed,
    ReportRecord,
    Started,
    UnknownRecord,
    append_record,
    parse_record,
    read_report,
    record_type,
    registered_types,
)
from dssup.runtime.plan import read_plan
from dssup.runtime.report import (
    report_batch_changed,
    report_checkpoint,
    report_completed,
    report_started,
)
from dssup.supervisor.report import check_batch, describe_records, read_attempt_report

ENV = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "DSSUP_ATTEMPT": "3"}


def _env(tmp_path):
    return {**ENV, "DSSUP_REPORT_FILE": str(tmp_path / "report.jsonl")}


def test_helpers_write_every_type_and_the_reader_types_them(tmp_path):
    env = _env(tmp_path)
    started = report_started(micro_batch=8, grad_accum=2, first_step=4, env=env)
    assert started is not None and started.global_batch == 32 and started.dp == 2
    assert report_checkpoint(6, tmp_path / "ckpt-6", env=env)
    assert report_batch_changed(step=7, micro_batch=4, grad_accum=4, dp=2, reason="OOM", env=env)
    assert report_completed(8, env=env)
    got = read_report(tmp_path / "report.jsonl")
    assert got.problems == ()
    assert [r.type for r in got.records] == ["started", "checkpoint", "batch-changed", "completed"]
    first = got.records[0]
    assert isinstance(first, Started)
    assert (first.rank, first.local_rank, first.attempt, first.first_step) == (1, 1, 3, 4)
    assert isinstance(got.records[2], BatchChanged) and got.records[2].global_batch == 32
    assert got.of(Completed)[0].step == 8


def test_without_dssup_nothing_is_written(tmp_path):
    assert report_started(micro_batch=8, grad_accum=2, env={"WORLD_SIZE": "2"}) is None
    assert not report_completed(env={})
    assert list(tmp_path.iterdir()) == []


def test_started_records_which_knobs_came_from_the_environment(tmp_path):
    env = {**_env(tmp_path), "DSSUP_MICRO_BATCH_SIZE": "8", "DSSUP_GRAD_ACCUM_STEPS": "2"}
    read_plan(micro_batch=16, grad_accum=1, env=env)
    rec = report_started(micro_batch=8, grad_accum=2, env=env)
    assert rec is not None and rec.env_knobs == ("grad_accum", "micro_batch")
    read_plan(micro_batch=16, grad_accum=1, env={})  # a script run without dssup
    assert report_started(micro_batch=16, grad_accum=1, env=env).env_knobs == ()  # type: ignore[union-attr]


def _writer(path: str, rank: int, count: int) -> None:
    env = {"DSSUP_REPORT_FILE": path, "RANK": str(rank), "WORLD_SIZE": "4"}
    for step in range(count):
        report_checkpoint(step, "x" * 300, env=env)


def test_concurrent_appends_from_many_processes_never_interleave(tmp_path):
    path = str(tmp_path / "report.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, r, 150)) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = read_report(tmp_path / "report.jsonl")
    assert got.problems == ()
    assert len(got.records) == 600
    for rank in range(4):
        steps = [r.step for r in got.records if r.rank == rank]  # type: ignore[attr-defined]
        assert steps == list(range(150))


def test_torn_and_bad_lines_are_problems_never_misread(tmp_path):
    path = tmp_path / "report.jsonl"
    append_record(path, Completed(rank=0, step=3))
    with open(path, "a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"type": "started", "rank": 0, "micro_batch": 0}) + "\n")
        fh.write('{"type": "completed", "rank": 1')  # cut short by a crash: no newline
    got = read_report(path)
    assert [r.type for r in got.records] == ["completed"]
    assert len(got.problems) == 3
    assert "incomplete" in got.problems[-1]
    assert read_report(tmp_path / "absent.jsonl").records == ()


def test_an_unknown_record_type_is_kept_not_an_error():
    rec = parse_record({"type": "from-the-future", "rank": 2, "whatever": [1, 2]})
    assert isinstance(rec, UnknownRecord) and rec.rank == 2
    assert "does not know" in rec.describe()


def test_a_new_record_type_is_read_checked_and_told_without_changing_the_reader(tmp_path):
    """What issue 17 does: a new record type with batch fields is checked like the others."""

    @record_type
    class GuardSplit(ReportRecord):
        type: Literal["test-guard-split"] = "test-guard-split"
        micro_batch: int = Field(ge=1, description="sequences per micro-batch")
        grad_accum: int = Field(ge=1, description="micro-batches per step")
        dp: int = Field(ge=1, description="data-parallel ranks")
        global_batch: int = Field(ge=1, description="sequences per step")

        def describe(self) -> str:
            return f"rank {self.rank} split finer: {self.micro_batch} x {self.grad_accum}"

    assert registered_types()["test-guard-split"] is GuardSplit
    path = tmp_path / "report.jsonl"
    append_record(path, Started(rank=0, world_size=2, dp=2, micro_batch=16, grad_accum=1,
                                global_batch=32, first_step=0))  # fmt: skip
    append_record(path, GuardSplit(rank=0, micro_batch=8, grad_accum=1, dp=2, global_batch=16))
    report = read_attempt_report(tmp_path, expected=32)
    assert report.batch.status == "mismatch"  # 8 x 1 x 2 = 16: the new record is checked
    assert "rank 0 split finer: 8 x 1" in describe_records(report.records)


def _started(rank: int, mb: int, gas: int, dp: int, gb: int) -> Started:
    return Started(rank=rank, world_size=dp, dp=dp, micro_batch=mb, grad_accum=gas,
                   global_batch=gb, source="test")  # fmt: skip


@pytest.mark.parametrize(
    ("records", "expected", "status", "words"),
    [
        ([], 32, "unreported", "global batch 32 planned; not reported by the job: unverified"),
        ([_started(0, 16, 1, 2, 32), _started(1, 16, 1, 2, 32)], 32, "verified",
         "global batch 32 (verified by the job)"),
        ([_started(0, 8, 1, 2, 16)], 32, "mismatch", "dssup keeps global batch 32, but rank 0"),
        ([_started(0, 8, 2, 2, 16)], None, "mismatch", "x 2 data-parallel = 32, but global batch 16"),
        ([_started(0, 8, 2, 2, 32)], None, "verified", "global batch 32 (verified by the job)"),
        ([_started(0, 8, 2, 2, 32), _started(1, 8, 1, 2, 16)], None, "mismatch", "different"),
    ],
)  # fmt: skip
def test_batch_verdicts(records, expected, status, words):
    check = check_batch(records, expected)
    assert check.status == status
    assert words in check.text() + " " + check.detail


def test_batch_changed_in_process_keeps_the_verdict_when_the_global_batch_stays():
    records = [_started(0, 16, 1, 2, 32), BatchChanged(rank=0, step=5, dp=2, micro_batch=8,
                                                      grad_accum=2, global_batch=32)]  # fmt: skip
    assert check_batch(records, 32).status == "verified"
