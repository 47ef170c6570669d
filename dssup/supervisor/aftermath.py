"""After an attempt: what the job said about it, journalled, and the promise it is held to.

The global batch the run promises is the plan's, or, when the plan never knew it, the first
one a job verified. Each attempt's ``job-report`` record holds the job's own records (its
report file plus what its framework printed on rank 0), the verdict on the global batch, the
step the job says it started from, and the ranks that said they completed. The console is told
the verdict, and told when a job handed a checkpoint reported starting before it (it did not
resume).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dssup.jobreport import ReportRecord
from dssup.supervisor.journal import Journal
from dssup.supervisor.launchers.base import LaunchCommand
from dssup.supervisor.models import TrainingPlan
from dssup.supervisor.report import AttemptReport, read_attempt_report

__all__ = ["journal_report", "kept_global_batch", "rank0_output"]


def kept_global_batch(journal: Journal, plan: TrainingPlan) -> int | None:
    """The global batch the run promises: the plan's, else the first one a job verified."""
    if plan.global_batch is not None:
        return plan.global_batch
    for rec in journal.of_type("job-report"):
        batch = rec.get("batch") or {}
        if batch.get("status") == "verified":
            return int(batch["reported"][0])
    return None


def journal_report(
    journal: Journal,
    number: int,
    attempt_dir: Path,
    plan: TrainingPlan,
    derived: Sequence[ReportRecord],
    say: Callable[[str], None],
) -> AttemptReport:
    """Read, judge and journal what the job reported about attempt ``number``."""
    report = read_attempt_report(attempt_dir, kept_global_batch(journal, plan), derived)
    batch = {**report.batch.model_dump(mode="json"), "text": report.batch.text()}
    journal.append(
        "job-report",
        attempt=number,
        batch=batch,
        first_step=report.first_step,
        completed_ranks=list(report.completed_ranks),
        checkpoints=list(report.checkpoints),
        records=list(report.records),
        problems=list(report.problems),
    )
    say(f"attempt {number}: {report.batch.text()}")
    started = [r for r in journal.of_type("attempt-started") if r["attempt"] == number]
    handed = started[-1].get("resume_step") if started else None
    if handed and report.first_step is not None and report.first_step < handed:
        say(f"warning: attempt {number} was handed the step-{handed} checkpoint but the job "
            f"reported starting at step {report.first_step}: it did not resume")  # fmt: skip
    return report


def rank0_output(cmd: LaunchCommand, attempt_dir: Path) -> Path | None:
    """Rank 0's output file of an attempt (the console when the launcher keeps none)."""
    log_dir = cmd.launcher.log_dir(cmd, attempt_dir)
    if log_dir is None:
        return attempt_dir / "torchrun.log"
    ranks = cmd.launcher.rank_logs(log_dir)
    return ranks[0].output if 0 in ranks else None
