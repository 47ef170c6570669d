"""The supervisor's reading of the job-side report: is the global batch verified, by whom?

dssup promises an exact global batch; the plan it hands out is only a request. After every
attempt it reads the job's own records (``dssup.jobreport``: written by ``dssup.runtime``'s
helpers, the HF ``DssupCallback``, or derived from the figures a framework prints, such as HF
Trainer's "Total train batch size") and judges:

* **verified**: at least one rank reported, every reported figure multiplies out
  (micro x accumulation x DP = global batch) and equals the global batch dssup keeps;
* **mismatch**: a reported global batch differs from it (or the job's own figures do not
  multiply out): the promise is broken, the run fails with exit 3;
* **unreported**: no record; the summary then says "unverified", never "unchanged".

Any record type with ``micro_batch``, ``grad_accum``, ``dp`` and ``global_batch`` fields takes part
in the check, so a new in-process remedy record is checked without a change here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.jobreport import (
    ENV_VAR,
    FILENAME,
    Completed,
    ReportFile,
    ReportRecord,
    Started,
    parse_record,
    read_report,
)

__all__ = [
    "ENV_VAR",
    "AttemptReport",
    "BatchCheck",
    "check_batch",
    "describe_records",
    "read_attempt_report",
    "report_path",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Status = Literal["verified", "mismatch", "unreported"]


def report_path(attempt_dir: Path) -> Path:
    """Where an attempt's job-side report lives (``DSSUP_REPORT_FILE``)."""
    return attempt_dir / FILENAME


class BatchCheck(BaseModel):
    """The verdict on one attempt's global batch."""

    model_config = _FROZEN
    status: Status = Field(description="verified, mismatch or unreported")
    expected: int | None = Field(None, description="global batch dssup keeps; None: not known")
    reported: tuple[int, ...] = Field((), description="distinct global batches the job reported")
    ranks: tuple[int, ...] = Field((), description="ranks whose records were checked")
    sources: tuple[str, ...] = Field((), description="what wrote those records")
    detail: str = Field("", description="why, in one sentence")

    def text(self) -> str:
        """How the summary and ``dssup status`` say it."""
        if self.status == "verified":
            return f"global batch {self.reported[0]} (verified by the job)"
        if self.status == "mismatch":
            return f"global batch MISMATCH: {self.detail}"
        planned = f"global batch {self.expected} planned; " if self.expected else "global batch "
        return f"{planned}not reported by the job: unverified"


def _batch_records(records: Sequence[ReportRecord]) -> list[ReportRecord]:
    fields = ("micro_batch", "grad_accum", "dp", "global_batch")
    return [r for r in records if all(isinstance(getattr(r, f, None), int) for f in fields)]


def _figures(r: ReportRecord) -> tuple[int, int, int, int]:
    return (
        int(getattr(r, "micro_batch")),  # noqa: B009 - duck-typed record fields
        int(getattr(r, "grad_accum")),  # noqa: B009
        int(getattr(r, "dp")),  # noqa: B009
        int(getattr(r, "global_batch")),  # noqa: B009
    )


def check_batch(records: Sequence[ReportRecord], expected: int | None) -> BatchCheck:
    """Judge the global batch of one attempt from the job's records (see the module doc)."""
    batch = _batch_records(records)
    ranks = tuple(sorted({r.rank for r in batch}))
    sources = tuple(sorted({r.source for r in batch if r.source}))
    if not batch:
        return BatchCheck(status="unreported", expected=expected, detail="no batch record")
    reported = tuple(sorted({_figures(r)[3] for r in batch}))
    common = {"expected": expected, "reported": reported, "ranks": ranks, "sources": sources}
    for r in batch:
        mb, gas, dp, gb = _figures(r)
        if mb * gas * dp != gb:
            detail = (
                f"rank {r.rank} reported micro-batch {mb} x accumulation {gas} x {dp} "
                f"data-parallel = {mb * gas * dp}, but global batch {gb} ({r.type})"
            )
            return BatchCheck(status="mismatch", detail=detail, **common)
    wrong = [r for r in batch if expected is not None and _figures(r)[3] != expected]
    if wrong:
        r = wrong[0]
        mb, gas, dp, gb = _figures(r)
        detail = (
            f"dssup keeps global batch {expected}, but rank {r.rank} trains with {gb} "
            f"(micro-batch {mb} x accumulation {gas} x {dp} data-parallel, {r.type} record "
            f"from {r.source or 'the job'})"
        )
        return BatchCheck(status="mismatch", detail=detail, **common)
    if len(reported) > 1:
        detail = f"the job reported different global batches {list(reported)}"
        return BatchCheck(status="mismatch", detail=detail, **common)
    detail = f"ranks {list(ranks)} reported global batch {reported[0]}"
    return BatchCheck(status="verified", detail=detail, **common)


class AttemptReport(BaseModel):
    """What one attempt's report says, digested for the journal and the decisions."""

    model_config = _FROZEN
    batch: BatchCheck
    first_step: int | None = Field(None, description="lowest first step any rank reported")
    completed_ranks: tuple[int, ...] = Field((), description="ranks that reported completion")
    checkpoints: tuple[int, ...] = Field((), description="checkpoint steps the job reported")
    records: tuple[dict[str, Any], ...] = Field((), description="every record, as written")
    problems: tuple[str, ...] = Field((), description="lines that could not be read")


def read_attempt_report(
    attempt_dir: Path, expected: int | None, derived: Sequence[ReportRecord] = ()
) -> AttemptReport:
    """The attempt's report file plus records ``derived`` from what its framework printed."""
    found: ReportFile = read_report(report_path(attempt_dir))
    records = [*found.records, *derived]
    starts = [r for r in records if isinstance(r, Started) and r.first_step is not None]
    return AttemptReport(
        batch=check_batch(records, expected),
        first_step=min((r.first_step for r in starts if r.first_step is not None), default=None),
        completed_ranks=tuple(sorted({r.rank for r in records if isinstance(r, Completed)})),
        checkpoints=tuple(
            sorted({int(getattr(r, "step", 0)) for r in records if r.type == "checkpoint"})
        ),
        records=tuple(r.model_dump(mode="json") for r in records),
        problems=found.problems,
    )


def describe_records(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Plain sentences for journalled records (any registered type; unknown ones named)."""
    out = []
    for doc in docs:
        try:
            out.append(parse_record(doc).describe())
        except ValueError as exc:
            out.append(f"unreadable record ({exc})")
    return out
