"""The job-side report: what the training job really used, one JSON line per event.

Why it exists: ``dssup run`` hands a plan to the training script (rewritten flags, the
``DSSUP_*`` environment), but only the job knows what it did with it. A script that ignores
``DSSUP_GRAD_ACCUM_STEPS`` trains at a different global batch while the supervisor's own plan
still says 32. So the job reports, and the supervisor says "verified by the job" only where a
record backs it, "unverified" everywhere else.

The wire format is shared by both sides, so it lives here (stdlib + pydantic, no torch): the
training side (``dssup.runtime.report``, the HF ``DssupCallback``) writes records, the
supervisor (``dssup.supervisor.report``) reads them.

* Where: the file named by ``DSSUP_REPORT_FILE``; dssup sets it to
  ``<attempt-dir>/report.jsonl``, one file per attempt shared by all ranks of the node.
* How: one JSON object per line, appended with a single ``O_APPEND`` write and fsynced, so
  lines of different ranks never interleave and a reader sees whole lines (a line cut by a
  crash is reported as a problem and skipped, never misread).
* What: every record carries ``v`` (schema version), ``type``, ``ts``, ``attempt``, ``rank``,
  ``local_rank`` and ``source``. Types: ``started`` (micro-batch, accumulation, world and
  data-parallel size, global batch, first step), ``checkpoint`` (a checkpoint the job saved),
  ``batch-changed`` (the job changed its micro-batch split in-process, global batch kept),
  ``completed`` (training finished on this rank); and, from ``dssup.runtime``'s step guard
  (in-process OOM recovery), ``inprocess-guard`` (the guard is armed: how it synchronises and
  how long it waits for a verdict), ``inprocess-remedy`` (every rank agreed on a finer split of
  the same global batch after an OOM: old and new split, the step, which ranks OOMed and where)
  and ``inprocess-gave-up`` (in-process recovery could not proceed, why, and the exit status
  the guard leaves with so that the supervisor takes over).

Adding a record type (e.g. an in-process remedy) is one subclass of ``ReportRecord`` with a
``Literal`` ``type`` and a ``describe()``, decorated with ``@record_type``: ``parse_record`` and
``read_report`` then return it, the supervisor journals it and ``dssup status`` tells it, with
no change to the reader. A type the reader does not know (a newer job-side dssup) is kept as
an ``UnknownRecord``, never an error.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "ENV_VAR",
    "FILENAME",
    "SCHEMA_VERSION",
    "BatchChanged",
    "CheckpointSaved",
    "Completed",
    "InProcessGaveUp",
    "InProcessGuard",
    "InProcessRemedy",
    "ReportFile",
    "ReportRecord",
    "Started",
    "UnknownRecord",
    "append_record",
    "parse_record",
    "read_report",
    "record_type",
    "registered_types",
]

ENV_VAR = "DSSUP_REPORT_FILE"
FILENAME = "report.jsonl"
SCHEMA_VERSION = 1
_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ReportRecord(BaseModel):
    """Fields every record carries. Subclasses add their own and a ``describe()``."""

    model_config = _FROZEN
    v: int = Field(SCHEMA_VERSION, description="schema version of the record")
    type: str = Field(description="record type, a stable kebab-case slug")
    ts: float = Field(default_factory=time.time, description="wall-clock time, epoch seconds")
    attempt: int | None = Field(None, description="DSSUP_ATTEMPT of the writer; None outside dssup")
    rank: int = Field(0, ge=0, description="global rank of the writer")
    local_rank: int | None = Field(None, ge=0, description="rank on its node")
    source: str = Field("", description="what wrote it: a dssup helper, a callback, a log parser")

    def describe(self) -> str:
        """One plain sentence for ``dssup status``."""
        return f"rank {self.rank}: {self.type}"


_T = TypeVar("_T", bound=type[ReportRecord])
_R = TypeVar("_R", bound=ReportRecord)
_TYPES: dict[str, type[ReportRecord]] = {}


def record_type(cls: _T) -> _T:
    """Register a record class under the default of its ``type`` field."""
    model: type[ReportRecord] = cls
    slug = model.model_fields["type"].default
    if not isinstance(slug, str) or not slug:
        raise TypeError(f"{cls.__name__}.type needs a string default")
    _TYPES[slug] = cls
    return cls


@record_type
class Started(ReportRecord):
    """What one rank trains with, as the job itself computed it, at the start of an attempt."""

    type: Literal["started"] = "started"
    world_size: int = Field(ge=1, description="ranks in the job")
    dp: int = Field(ge=1, description="data-parallel ranks (world size over model parallelism)")
    micro_batch: int = Field(ge=1, description="sequences per micro-batch per rank")
    grad_accum: int = Field(ge=1, description="micro-batches per optimizer step")
    global_batch: int = Field(ge=1, description="sequences per optimizer step, as the job uses it")
    first_step: int | None = Field(
        None, ge=0, description="optimizer steps already done when the attempt starts (0: fresh)"
    )
    resumed_from: str | None = Field(None, description="checkpoint the job loaded, if any")
    recompute: str | None = Field(None, description="none, selective, full; None: not said")
    framework: str = Field("plain", description="plain, hf-trainer, deepspeed, ...")
    env_knobs: tuple[str, ...] = Field(
        (), description="plan fields the job took from DSSUP_* variables (micro_batch, ...)"
    )

    @property
    def consistent(self) -> bool:
        """The job's own figures multiply out: micro x accumulation x DP = global batch."""
        return self.micro_batch * self.grad_accum * self.dp == self.global_batch

    def describe(self) -> str:
        start = "from scratch" if not self.first_step else f"from step {self.first_step}"
        if self.first_step is None:
            start = "start step not reported"
        return (
            f"rank {self.rank} started {start}: micro-batch {self.micro_batch} x accumulation "
            f"{self.grad_accum} x {self.dp} data-parallel = global batch {self.global_batch}"
        )


@record_type
class CheckpointSaved(ReportRecord):
    """The job finished writing a checkpoint."""

    type: Literal["checkpoint"] = "checkpoint"
    step: int = Field(ge=0, description="optimizer steps the checkpoint holds")
    path: str = Field("", description="where it was written")

    def describe(self) -> str:
        return f"rank {self.rank} saved the step-{self.step} checkpoint {self.path}".rstrip()


@record_type
class BatchChanged(ReportRecord):
    """The job changed how it splits the global batch without a restart (an in-process
    remedy); the global batch must stay what it was."""

    type: Literal["batch-changed"] = "batch-changed"
    step: int = Field(ge=0, description="optimizer step from which the new split applies")
    dp: int = Field(ge=1, description="data-parallel ranks")
    micro_batch: int = Field(ge=1, description="new sequences per micro-batch per rank")
    grad_accum: int = Field(ge=1, description="new micro-batches per optimizer step")
    global_batch: int = Field(ge=1, description="sequences per optimizer step after the change")
    reason: str = Field("", description="why the job changed it (e.g. the OOM it caught)")

    @property
    def consistent(self) -> bool:
        return self.micro_batch * self.grad_accum * self.dp == self.global_batch

    def describe(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return (
            f"rank {self.rank} changed its split in-process at step {self.step}: micro-batch "
            f"{self.micro_batch} x accumulation {self.grad_accum}, global batch "
            f"{self.global_batch}{why}"
        )


@record_type
class Completed(ReportRecord):
    """Training finished on this rank. With ``final`` (the default: ``clean_exit``,
    ``mark_done``) the script's own work is done too, so whatever fails after it is teardown;
    without it (a Trainer callback's ``on_train_end``, before the script's final save) only the
    training loop ended, and a failure after it leaves the final save unverified."""

    type: Literal["completed"] = "completed"
    step: int | None = Field(None, ge=0, description="final optimizer step; None: not said")
    final: bool = Field(
        True, description="the script's work (its final save) is done, not only training"
    )

    def describe(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        what = "completed" if self.final else "ended its training loop (final save to follow)"
        return f"rank {self.rank} {what}{at}"


@record_type
class InProcessGuard(ReportRecord):
    """This rank runs its optimizer steps under ``dssup.runtime.StepGuard``: an OOM in a
    micro-batch is recovered in-process where it can be, and otherwise ends the worker with
    ``exit_code`` and an ``inprocess-gave-up`` record."""

    type: Literal["inprocess-guard"] = "inprocess-guard"
    sync: str = Field(description="how gradients are synchronised: deferred, last or local")
    min_micro_batch: int = Field(1, ge=1, description="finest split the guard moves to")
    verdict_floor_s: float = Field(ge=0, description="least time a rank waits for a verdict, s")
    exit_code: int = Field(description="exit status of a worker whose guard gave up")

    def describe(self) -> str:
        return (
            f"rank {self.rank} runs with in-process OOM recovery ({self.sync} gradient sync, "
            f"micro-batch down to {self.min_micro_batch})"
        )


@record_type
class InProcessRemedy(ReportRecord):
    """Every rank agreed, after an OOM, to redo the same global batch with a finer split. The
    new split is ``micro_batch`` x ``grad_accum`` (so the global-batch check covers it)."""

    type: Literal["inprocess-remedy"] = "inprocess-remedy"
    step: int = Field(ge=0, description="optimizer steps done before the redone one")
    old_micro_batch: int = Field(ge=1, description="sequences per micro-batch per rank before")
    old_grad_accum: int = Field(ge=1, description="micro-batches per optimizer step before")
    micro_batch: int = Field(ge=1, description="sequences per micro-batch per rank from now on")
    grad_accum: int = Field(ge=1, description="micro-batches per optimizer step from now on")
    dp: int = Field(ge=1, description="data-parallel ranks")
    global_batch: int = Field(ge=1, description="sequences per optimizer step (unchanged)")
    oom_ranks: tuple[int, ...] = Field(description="ranks that ran out of memory")
    oom_phases: tuple[str, ...] = Field(description="forward or backward, one per OOM rank")
    error: str = Field("", description="this rank's own OOM message; empty if it did not OOM")
    lost_s: float = Field(0.0, ge=0, description="seconds from the step's start to the verdict")

    @property
    def consistent(self) -> bool:
        return self.micro_batch * self.grad_accum * self.dp == self.global_batch

    def describe(self) -> str:
        where = ", ".join(
            f"rank {r} in {p}" for r, p in zip(self.oom_ranks, self.oom_phases, strict=True)
        )
        return (
            f"rank {self.rank} redid step {self.step} in-process after an OOM ({where}): "
            f"micro-batch {self.old_micro_batch} -> {self.micro_batch}, accumulation "
            f"{self.old_grad_accum} -> {self.grad_accum}, global batch {self.global_batch}"
        )


@record_type
class InProcessGaveUp(ReportRecord):
    """In-process recovery could not proceed; the worker exits with ``exit_code`` and the
    supervisor's restart path takes over from the split in ``micro_batch`` x ``grad_accum``."""

    type: Literal["inprocess-gave-up"] = "inprocess-gave-up"
    step: int = Field(ge=0, description="optimizer steps done before the failed one")
    reason: str = Field(
        description="kebab-case: micro-batch-floor, oom-in-synchronised-micro-batch, "
        "oom-in-gradient-sync, oom-in-optimizer-step, peer-lost, verdict-timeout, peer-error"
    )
    detail: str = Field("", description="the reason in one sentence")
    phase: str = Field("", description="where this rank failed: forward, backward, sync, ...")
    micro_batch: int = Field(ge=1, description="sequences per micro-batch per rank at the end")
    grad_accum: int = Field(ge=1, description="micro-batches per optimizer step at the end")
    dp: int = Field(ge=1, description="data-parallel ranks")
    global_batch: int = Field(ge=1, description="sequences per optimizer step")
    oom_ranks: tuple[int, ...] = Field((), description="ranks that reported an OOM, if known")
    error: str = Field("", description="this rank's own error message, if it had one")
    exit_code: int = Field(description="the status this worker exits with")

    def describe(self) -> str:
        return (
            f"rank {self.rank} gave up in-process recovery at step {self.step} "
            f"({self.reason}: {self.detail}); exit {self.exit_code}, the supervisor takes over"
        )


class UnknownRecord(ReportRecord):
    """A record of a type this reader does not know; kept as written."""

    model_config = ConfigDict(frozen=True, extra="allow")

    def describe(self) -> str:
        return f"rank {self.rank}: {self.type} (a record type this dssup does not know)"


def parse_record(doc: dict[str, Any]) -> ReportRecord:
    """The typed record for one decoded line; raises ``ValueError`` when it is malformed."""
    kind = doc.get("type")
    if not isinstance(kind, str):
        raise ValueError("no 'type'")
    cls = _TYPES.get(kind)
    try:
        if cls is None:
            return UnknownRecord.model_validate(doc)
        return cls.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"{kind}: {where}: {err['msg']}") from exc


class ReportFile(BaseModel):
    """Everything one attempt's report file holds, in file order, and what could not be read."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    records: tuple[ReportRecord, ...] = Field((), description="records in the order written")
    problems: tuple[str, ...] = Field((), description="lines that could not be read, and why")

    def of(self, cls: type[_R]) -> list[_R]:
        return [r for r in self.records if isinstance(r, cls)]

    def where(self, test: Callable[[ReportRecord], bool]) -> list[ReportRecord]:
        return [r for r in self.records if test(r)]


def read_report(path: Path) -> ReportFile:
    """Read a report file; a missing file is an empty report (the job did not report)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ReportFile()
    records: list[ReportRecord] = []
    problems: list[str] = []
    lines = data.split(b"\n")
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if n == len(lines):  # no newline after it: a write cut short
            problems.append(f"line {n}: incomplete (no newline); skipped")
            continue
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            records.append(parse_record(doc))
        except ValueError as exc:
            problems.append(f"line {n}: {exc}")
    return ReportFile(records=tuple(records), problems=tuple(problems))


def append_record(path: Path | str, record: ReportRecord) -> None:
    """Append one record as one line: a single ``O_APPEND`` write, then fsync."""
    line = (record.model_dump_json() + "\n").encode()
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def registered_types() -> dict[str, type[ReportRecord]]:
    """Record type slug -> class, for every type this dssup knows."""
    return dict(_TYPES)
