"""The outer loop: launch, classify, decide, relaunch, with the journal as the only memory.

State (current plan, configs that failed, attempts used, progress) is always rebuilt from the
journal, so a supervisor started again after SIGKILL continues the same run: it first kills
what is left of the attempt it lost (found by the attempt's token), records that attempt as
interrupted, and relaunches the same plan from the latest complete checkpoint. Unknown
failures are retried with exponential backoff by tenacity; OOMs go to the remedy ladder; user
errors and exhausted budgets end the run with the child's status.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_attempt, wait_exponential

from dssup.jobreport import ReportRecord
from dssup.obs.metrics import Metrics, NullMetrics
from dssup.supervisor.adapters import (
    BUILTIN_CAPABILITIES,
    PlanAdapter,
    RemedyContext,
    assessments,
)
from dssup.supervisor.aftermath import journal_report, kept_global_batch, rank0_output
from dssup.supervisor.attempt import AttemptResult, build_spec, run_attempt
from dssup.supervisor.checkpoints import find_latest
from dssup.supervisor.command import LaunchCommand
from dssup.supervisor.config import SupervisorConfig
from dssup.supervisor.jobview import JobView
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.process import Child, terminate_token
from dssup.supervisor.remedies import RemedyPlanner, no_remedy_reason
from dssup.supervisor.report import AttemptReport
from dssup.supervisor.state import RunState, replay
from dssup.supervisor.text import clip

__all__ = ["RECOVERY_FAILED", "RunOutcome", "Supervisor"]

log = logging.getLogger(__name__)
# Retried as they are (same plan), with backoff: unknown failures, and communication failures
# whose root cause was not seen here (on another node, or a network blip).
_RETRIED = frozenset({FailureKind.TRANSIENT, FailureKind.COMM})
# Exit status of a run whose training finished after a recovery an adapter judged broken (the
# loss jumped, samples were skipped or repeated), or whose job reported a global batch other
# than the one dssup keeps: the result is not to be trusted as it is.
RECOVERY_FAILED = 3


@dataclass
class RunOutcome:
    exit_code: int
    reason: str
    journal: Journal


@dataclass
class Supervisor:
    config: SupervisorConfig
    command: LaunchCommand
    planner: RemedyPlanner
    adapters: Sequence[PlanAdapter] = ()
    metrics: Metrics = field(default_factory=NullMetrics)
    sink: Callable[[str], None] | None = None
    sleep: Callable[[float], None] = time.sleep
    view: JobView | None = None  # the hand-off and framework of this script (None: builtin)
    say: Callable[[str], None] | None = None  # dssup's own lines for the console
    _signal: int | None = None
    _child: Child | None = None

    def _say(self, text: str) -> None:
        log.debug("%s", text)
        if self.say is not None:
            self.say(f"dssup: {text}")

    # --- signals -------------------------------------------------------------------------
    def request_stop(self, sig: int) -> None:
        """Called from a signal handler: forward once torchrun runs, never relaunch."""
        self._signal = sig

    def _install(self) -> dict[int, Any]:
        old: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: the caller forwards
                old[sig] = signal.signal(sig, lambda s, _f: self.request_stop(s))
        return old

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> RunOutcome:
        journal = Journal(self.config.run_dir)
        if not journal.started:
            journal.append(
                "run-started",
                run_id=self.config.run_id,
                command=self.config.command,
                plan=self.config.initial_plan.model_dump(mode="json"),
                config=self.config.model_dump(mode="json", exclude={"initial_plan"}),
            )
        else:
            self._recover(journal)
        self._announce(journal)
        old = self._install()
        try:
            return self._loop(journal)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _announce(self, journal: Journal) -> None:
        """The hand-off plan: journalled once, printed whenever dssup (re)starts the run."""
        if self.view is None:
            return
        plan = replay(journal, self.config.initial_plan).plan
        for rec in journal.of_type("job-report"):  # a restarted supervisor relearns
            self.view.learn(rec.get("records") or [])
        if journal.last("handoff") is None:
            journal.append("handoff", **self.view.handoff.model_dump(mode="json"))
        for line in self.view.handoff.lines(plan):
            self._say(line)

    def _recover(self, journal: Journal) -> None:
        lost = journal.open_attempt()
        killed: list[int] = []
        if lost is not None:
            killed = terminate_token(lost["token"], self.config.grace_s)
            journal.append(
                "attempt-ended",
                attempt=lost["attempt"],
                exit_code=None,
                duration_s=None,
                failure=Failure(
                    kind=FailureKind.INTERRUPTED,
                    message="supervisor was killed",
                    evidence=(f"orphans killed: {killed}",),
                ).model_dump(mode="json"),
                checkpoint_step=self._step(),
                stragglers=killed,
            )
        journal.append("supervisor-restarted", lost_attempt=lost and lost["attempt"], killed=killed)

    def _step(self) -> int | None:
        ref = find_latest(self.config.checkpoint_dir, self.config.checkpoint_pattern)
        return ref.step if ref else None

    def _loop(self, journal: Journal) -> RunOutcome:
        state = replay(journal, self.config.initial_plan)
        self.planner_calibration(state)
        while True:
            if state.attempts >= self.config.max_attempts:
                return self._end(
                    journal,
                    state,
                    "gave-up",
                    f"restart budget of {self.config.max_attempts} attempts used",
                )
            result = self._with_transient_retries(journal, state)
            failure = result.failure
            if result.report is not None and result.report.batch.status == "mismatch":
                reason = f"the job does not train with the planned global batch: {result.report.batch.detail}"
                log.error("%s", reason)
                return self._end(journal, state, "batch-mismatch", reason, RECOVERY_FAILED)
            if failure is None or failure.kind == FailureKind.TEARDOWN:
                return self._finished(journal, state)
            if failure.kind == FailureKind.INTERRUPTED:
                return self._end(
                    journal, state, "interrupted", failure.message, 128 + (failure.signal or 15)
                )
            if not failure.retryable:
                return self._end(
                    journal,
                    state,
                    "gave-up",
                    f"{failure.kind}: not retried ({clip(failure.message, 200)})",
                )
            if state.no_progress >= self.config.max_no_progress:
                return self._end(
                    journal,
                    state,
                    "gave-up",
                    f"{state.no_progress} attempts in a row without progress",
                )
            if failure.kind in _RETRIED:
                return self._end(
                    journal,
                    state,
                    "gave-up",
                    f"transient failures: {self.config.transient_retries} retries used",
                )
            if not self._remedy(journal, state, failure):
                last = journal.last("decision") or {}
                return self._end(journal, state, "gave-up", str(last.get("reason", "")))

    def planner_calibration(self, state: RunState) -> None:
        for step in self.planner.steps:
            if hasattr(step, "calibration_bytes") and state.calibration_bytes:
                step.calibration_bytes = state.calibration_bytes

    def _context(self, state: RunState) -> RemedyContext:
        adapter_caps = {c for a in self.adapters for c in a.capabilities}
        caps = frozenset(BUILTIN_CAPABILITIES | adapter_caps)
        check = None
        if self.view is not None:
            caps = self.view.capabilities
            check = self.view.check(state.plan, state.tried)
        return RemedyContext(frozenset(state.tried), caps, self.config.device, check,
                             progress_saved=state.best_step is not None)  # fmt: skip

    def _remedy(self, journal: Journal, state: RunState, failure: Failure) -> bool:
        remedy = self.planner.decide(failure, state.plan, self._context(state))
        skipped = list(self.planner.skipped)
        for line in skipped:
            self._say(f"not used: {line}")
        if remedy is None:
            reason = no_remedy_reason(failure, state.plan, skipped)
            journal.append("decision", action="give-up", after_attempt=state.attempts,
                           reason=reason, tried=sorted(state.tried), skipped=skipped)  # fmt: skip
            return False
        changes = {k: list(v) for k, v in remedy.plan.changes_from(state.plan).items()}
        journal.append(
            "decision",
            action="remedy",
            after_attempt=state.attempts,
            step=remedy.step,
            reason=remedy.reason,
            plan=remedy.plan.model_dump(mode="json"),
            changes=changes,
            predicted_peak_bytes=remedy.predicted_peak_bytes,
            calibration_bytes=remedy.calibration_bytes,
            skipped=skipped,
        )
        self._say(f"remedy {remedy.step}: {remedy.reason}")
        state.plan = remedy.plan
        return True

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
                    and r.failure.kind in _RETRIED
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

    def _attempt(self, journal: Journal, state: RunState) -> AttemptResult:
        if self._signal is not None:  # told to stop during a backoff: launch nothing
            now, sig = time.time(), self._signal
            stop = Failure(
                kind=FailureKind.INTERRUPTED, signal=sig, message="stopped between attempts"
            )
            return AttemptResult(-sig, stop, now, now, time.monotonic(), [])
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
        output = JobView.output(rank0_output(self.command, spec.dir))
        if self.view is not None:
            result.failure = self.view.finished(result.failure, result.started, output)
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

    def _finished(self, journal: Journal, state: RunState) -> RunOutcome:
        """Training finished; a recovery that an adapter judged broken still fails the run."""
        broken = [r for r in journal.of_type("continuity") if not r.get("ok", True)]
        if not broken:
            last = (journal.last("attempt-ended") or {}).get("failure") or {}
            after = f" (then, as teardown: {clip(last.get('message', ''), 200)})" if last else ""
            return self._end(journal, state, "succeeded", f"training finished{after}", 0)
        first = broken[0]
        reason = (
            f"training finished, but the recovery failed: attempt {first['attempt']} "
            f"({first['adapter']}): {first.get('verdict')}: {first.get('detail', '')}"
        )
        log.error("%s", reason)
        return self._end(journal, state, "recovery-failed", reason, RECOVERY_FAILED)

    def _write_metrics(self) -> None:
        path, write = self.config.metrics_textfile, getattr(self.metrics, "write_textfile", None)
        if path is not None and write is not None:
            write(path)

    def _end(
        self, journal: Journal, state: RunState, outcome: str, reason: str, code: int | None = None
    ) -> RunOutcome:
        if code is None:
            last = state.last_exit_code
            code = 128 - last if last is not None and last < 0 else (last or 125)
        journal.append(
            "run-ended",
            outcome=outcome,
            reason=reason,
            exit_code=code,
            final_plan=state.plan.model_dump(mode="json"),
        )
        return RunOutcome(code, reason, journal)


def plan_of(record: dict[str, Any]) -> TrainingPlan:
    return TrainingPlan.model_validate(record["plan"])
