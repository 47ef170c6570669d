"""The outer loop: launch, classify, decide, relaunch, with the journal as the only memory.

State (current plan, configs that failed, attempts used, progress) is always rebuilt from the
journal, so a supervisor started again after SIGKILL continues the same run: it first kills
what is left of the attempt it lost (found by the attempt's token), records that attempt as
interrupted, and relaunches the same plan from the latest complete checkpoint. Unknown
failures are retried with exponential backoff by tenacity; OOMs go to the remedy ladder; user
errors and exhausted budgets end the run with the child's status.

This module holds the decisions; running one attempt and recording it is
``attempt_cycle.py``, the shared fields and helpers ``loopbase.py``.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import Any

from dssup.supervisor.adapters import BUILTIN_CAPABILITIES, RemedyContext
from dssup.supervisor.attempt_cycle import RETRIED, AttemptCycle
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.process import terminate_token
from dssup.supervisor.remedies import no_remedy_reason
from dssup.supervisor.state import RunState, replay
from dssup.supervisor.text import clip

__all__ = ["RECOVERY_FAILED", "RunOutcome", "Supervisor"]

log = logging.getLogger(__name__)
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
class Supervisor(AttemptCycle):
    """``dssup run``'s loop for one node (fields: ``loopbase.SupervisorBase``)."""

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
            if failure.kind == FailureKind.UNVERIFIED_END:
                return self._unverified_end(journal, state, failure)
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
            if failure.kind in RETRIED:
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

    def _unverified_end(self, journal: Journal, state: RunState, failure: Failure) -> RunOutcome:
        """Trained to the end, then failed before its final save was seen whole: never called
        a success, never trained again (a relaunch would repeat finished steps)."""
        missing = next((e for e in reversed(failure.evidence) if "unverified" in e), "")
        step = self._step()
        kept = f"; the last complete checkpoint is step {step}" if step is not None else ""
        reason = (
            f"{clip(failure.message, 300)} ({missing}){kept}. Not relaunched (it would train "
            "finished steps again): check the final save before using it"
        )
        log.error("%s", reason)
        return self._end(journal, state, "unverified-end", reason)

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
