"""One attempt, start to record: launch the job, watch it, and journal what it did.

``AttemptCycle._with_transient_retries`` runs attempts of one plan until one ends in something
other than a transient failure (tenacity's exponential backoff, bounded by the transient and
no-progress budgets); ``_attempt`` resolves the resume checkpoint, launches, waits (fast fail
included), adds what the job's step guard said to the failure (``inprocess.refine``), lets
the framework reclassify the ending (training finished before a teardown crash), and journals
the attempt, the job's own report of what it trained with, its in-process recovery
(``inprocess.absorb``: remedies, give-up, the split it moved to) and what the adapters judge
of it. Deciding what to do next is ``supervisor.py``'s part.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_attempt, wait_exponential

from dssup.jobreport import ReportRecord
from dssup.supervisor.adapters import assessments
from dssup.supervisor.aftermath import journal_report, kept_global_batch, rank0_output
from dssup.supervisor.attempt import AttemptResult, AttemptSpec, build_spec, run_attempt
from dssup.supervisor.checkpoints import CheckpointRef, find_latest
from dssup.supervisor.inprocess import absorb, refine
from dssup.supervisor.jobview import JobView
from dssup.supervisor.journal import Journal
from dssup.supervisor.loopbase import SupervisorBase
from dssup.supervisor.models import Failure, FailureKind
from dssup.supervisor.report import AttemptReport
from dssup.supervisor.state import RunState

__all__ = ["RETRIED", "AttemptCycle"]

# Retried as they are (same plan), with backoff: unknown failures, and communication failures
# whose root cause was not seen here (on another node, or a network blip).
RETRIED = frozenset({FailureKind.TRANSIENT, FailureKind.COMM})


class AttemptCycle(SupervisorBase):
    """The attempt half of ``Supervisor`` (see the module docstring)."""

    def _with_transient_retries(self, journal: Journal, state: RunState) -> AttemptResult:
        left = max(0, self.config.transient_retries - state.transient_in_row)
        budget = max(1, min(left + 1, self.config.max_attempts - state.attempts))

        def before_sleep(rs: RetryCallState) -> None:
            delay = rs.upcoming_sleep
            journal.append(
                "decision",
                action="retry",
                after_attempt=state.attempts,
                reason=f"transient failure; backoff {delay:.1f} s",
                plan=state.plan.model_dump(mode="json"),
            )

        retrying = Retrying(
            stop=stop_after_attempt(budget),
            wait=wait_exponential(
                multiplier=self.config.backoff_initial_s,
                max=self.config.backoff_max_s,
                exp_base=2,
                min=self.config.backoff_initial_s,
            ),
            retry=retry_if_result(
                lambda r: (
                    r.failure is not None
                    and r.failure.kind in RETRIED
                    and (r.report is None or r.report.batch.status != "mismatch")
                    and self._signal is None
                    and state.no_progress < self.config.max_no_progress
                )
            ),
            sleep=self.sleep,
            before_sleep=before_sleep,
            retry_error_callback=lambda rs: rs.outcome.result() if rs.outcome else None,
        )
        result: AttemptResult = retrying(self._attempt, journal, state)
        return result

    def _prepare(
        self, journal: Journal, state: RunState
    ) -> tuple[int, CheckpointRef | None, AttemptSpec]:
        """The next attempt's number, the checkpoint it resumes from, and its launch spec."""
        number = journal.next_attempt()
        resume = find_latest(
            self.config.checkpoint_dir, self.config.checkpoint_pattern, state.plan.dp
        )
        if state.best_step is None and resume is not None:
            state.best_step = resume.step
        spec = build_spec(
            self.command,
            state.plan,
            number=number,
            run_id=self.config.run_id,
            run_dir=self.config.run_dir,
            resume=resume,
            checkpoint_dir=self.config.checkpoint_dir,
            adapters=self.adapters,
            view=self.view,
        )
        return number, resume, spec

    def _attempt(self, journal: Journal, state: RunState) -> AttemptResult:
        if self._signal is not None:  # told to stop during a backoff: launch nothing
            now, sig = time.time(), self._signal
            stop = Failure(
                kind=FailureKind.INTERRUPTED, signal=sig, message="stopped between attempts"
            )
            return AttemptResult(-sig, stop, now, now, time.monotonic(), [])
        number, resume, spec = self._prepare(journal, state)
        if self.view is not None:
            self._say(self.view.attempt_line(number, state.plan, resume))
            hint = self.view.checkpoint_hint(
                self.config.checkpoint_dir, self.config.checkpoint_pattern
            )
            if hint and resume is None:
                self._say(f"warning: {hint}")
                spec.notes.append(hint)
        journal.append(
            "attempt-started",
            attempt=number,
            token=spec.token,
            argv=spec.argv,
            plan=state.plan.model_dump(mode="json"),
            env=spec.env,
            notes=spec.notes,
            resume_from=str(resume.path) if resume else None,
            resume_step=resume.step if resume else None,
            relaunch_overhead_s=state.since_last_exit(),
        )
        if state.last_exit_mono is not None:
            self.metrics.supervisor_recovery(time.monotonic() - state.last_exit_mono)
        result = run_attempt(
            spec,
            self.command,
            world_size=state.plan.world_size,
            grace_s=self.config.grace_s,
            gpu_timeout_s=self.config.gpu_release_timeout_s,
            sink=self.sink,
            stop_signal=lambda: self._signal,
            on_start=lambda c: setattr(self, "_child", c),
            fast_fail=self.config.fast_fail,
            expected_global_batch=self._kept_global_batch(journal, state),
        )
        result.failure = refine(result.failure, spec.dir)  # what the job's step guard said
        output = JobView.output(rank0_output(self.command, spec.dir))
        if self.view is not None:
            result.failure = self.view.finished(result.failure, result.started, output, spec.dir)
        step = self._step()
        state.record(result, step)
        journal.append(
            "attempt-ended",
            attempt=number,
            exit_code=result.exit_code,
            duration_s=round(result.ended - result.started, 3),
            failure=result.failure.model_dump(mode="json") if result.failure else None,
            checkpoint_step=step,
            stragglers=result.stragglers,
            oom_kills=result.oom_kills,
            spawned_at=round(result.spawned_at, 4),
            exited_at=round(result.exited_at, 4),
        )
        derived = self.view.reported(output) if self.view is not None else []
        result.report = self._job_report(journal, number, spec.dir, state, derived)
        absorb(journal, number, result.report.records, state, result.failure)
        self._assess(journal, number, spec.dir)
        self.metrics.supervisor_attempt(result.failure.kind.value if result.failure else "success")
        self._write_metrics()
        return result

    def _kept_global_batch(self, journal: Journal, state: RunState) -> int | None:
        return kept_global_batch(journal, state.plan)

    def _job_report(
        self,
        journal: Journal,
        number: int,
        attempt_dir: Path,
        state: RunState,
        derived: Sequence[ReportRecord] = (),
    ) -> AttemptReport:
        """Read and journal what the job reported (and its framework printed: ``derived``),
        and learn from it which knobs the job takes from the environment."""
        report = journal_report(journal, number, attempt_dir, state.plan, derived, self._say)
        self._learn(journal, report.records, number)
        return report

    def _learn(self, journal: Journal, records: Sequence[dict[str, Any]], after: int) -> None:
        if self.view is None:
            return
        learned = self.view.learn(records)
        if learned:
            journal.append(
                "handoff", after_attempt=after, **self.view.handoff.model_dump(mode="json")
            )
            names = ", ".join(self.view.handoff.channels[k].name for k in learned)
            self._say(f"hand-off: the job's report shows it reads {names}: those knobs can change")

    def _assess(self, journal: Journal, number: int, attempt_dir: Path) -> None:
        """Journal what adapters judge of the attempt that just ended (loss continuity)."""
        for record in assessments(self.adapters, attempt_dir):
            journal.append("continuity", attempt=number, **record)
