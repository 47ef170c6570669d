"""The run's state, rebuilt from the journal alone (so a restarted supervisor knows everything).

``replay`` folds the journal's records into: the plan the next attempt must use, the keys of
every plan that failed with an OOM (never repeated), attempts used, consecutive unknown
failures, the distinct configs that failed since the last checkpoint progress, and the latest
calibration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dssup.supervisor.journal import Journal
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan

if TYPE_CHECKING:
    from dssup.supervisor.attempt import AttemptResult

__all__ = ["RunState", "replay"]


@dataclass
class RunState:
    plan: TrainingPlan
    tried: set[str] = field(default_factory=set)
    attempts: int = 0
    transient_in_row: int = 0
    no_progress: int = 0
    best_step: int | None = None
    calibration_bytes: int = 0
    last_exit_code: int | None = None
    last_exit_mono: float | None = None
    # configs that failed since the last checkpoint progress: the no-progress budget counts
    # these, not restarts (a transient retry of the same config costs nothing)
    stalled: set[str] = field(default_factory=set)

    def since_last_exit(self) -> float | None:
        if self.last_exit_mono is None:
            return None
        return round(time.monotonic() - self.last_exit_mono, 4)

    def _fold(
        self, plan: TrainingPlan, failure: Failure | None, exit_code: int | None, step: int | None
    ) -> None:
        self.attempts += 1
        self.last_exit_code = exit_code
        if failure is None or failure.kind == FailureKind.INTERRUPTED:
            return
        if failure.kind.is_oom:
            self.tried.add(plan.key())
        retried = failure.kind in {FailureKind.TRANSIENT, FailureKind.COMM}
        self.transient_in_row = self.transient_in_row + 1 if retried else 0
        advanced = step is not None and (self.best_step is None or step > self.best_step)
        if advanced:
            self.best_step = step
            self.stalled = set()
        else:
            self.stalled.add(plan.key())
        self.no_progress = len(self.stalled)

    def record(self, result: AttemptResult, step: int | None) -> None:
        self._fold(self.plan, result.failure, result.exit_code, step)
        self.last_exit_mono = result.exited_mono


def replay(journal: Journal, initial: TrainingPlan) -> RunState:
    started = journal.first("run-started")
    plan = TrainingPlan.model_validate(started["plan"]) if started else initial
    state = RunState(plan=plan)
    plans: dict[int, TrainingPlan] = {}
    for rec in journal.records:
        if rec["type"] == "attempt-started":
            plans[rec["attempt"]] = TrainingPlan.model_validate(rec["plan"])
            if state.best_step is None and rec.get("resume_step") is not None:
                state.best_step = rec["resume_step"]
        elif rec["type"] == "attempt-ended":
            failure = Failure.model_validate(rec["failure"]) if rec.get("failure") else None
            state._fold(
                plans.get(rec["attempt"], state.plan),
                failure,
                rec.get("exit_code"),
                rec.get("checkpoint_step"),
            )
        elif rec["type"] == "decision" and rec.get("plan"):
            state.plan = TrainingPlan.model_validate(rec["plan"])
            state.calibration_bytes = max(
                state.calibration_bytes, rec.get("calibration_bytes") or 0
            )
    return state
