"""The job's own OOM recovery (``dssup.runtime.StepGuard``), as the supervisor keeps track of it.

A guarded job redoes a step at a finer micro-batch split without a restart, and tells the
supervisor in its report (``dssup.jobreport``: ``inprocess-guard``, ``inprocess-remedy``,
``inprocess-gave-up``). The supervisor must not lose that, or its next restart would go back to
a split the job already saw fail. After each attempt it therefore:

* ``refine``: before the attempt's failure is journalled, adds to it what the guard said: each
  worker that exited with the guard's status (75) and why it gave up; a failure the evidence
  left unknown (``transient``) whose guard reported an OOM becomes that OOM (kind and phase).
  A guard that was armed but wrote no give-up (a rank killed by a signal, a failure outside any
  guarded step) is said too: in-process recovery needs every rank alive.
* ``absorb``: journals one ``inprocess-remedy`` record per decision the ranks agreed on, one
  ``inprocess-gave-up`` record when recovery stopped (the job's reason, or the supervisor's own
  when no rank could say), and, when the job ended on another split than the attempt's plan, a
  ``decision`` with ``action: in-process``: its ``plan`` becomes the plan (``replay`` reads it
  like any decision) and ``tried_add`` lists the splits that failed, never tried again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dssup.jobreport import (
    InProcessGaveUp,
    InProcessGuard,
    InProcessRemedy,
    ReportRecord,
    parse_record,
    read_report,
)
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.report import report_path
from dssup.supervisor.signatures import match
from dssup.supervisor.state import RunState

__all__ = ["GAVE_UP_EXIT", "absorb", "guard_gave_up", "refine"]

GAVE_UP_EXIT = 75  # dssup.runtime.GAVE_UP_EXIT (the runtime is not imported here)
_BYSTANDER = frozenset({"peer-lost", "verdict-timeout", "peer-error"})


def guard_gave_up(error_file: Path) -> bool:
    """Whether a torchelastic error file was written by a step guard that gave up."""
    try:
        doc = json.loads(error_file.read_text(errors="replace"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("dssup_inprocess"), dict)


def _typed(records: Sequence[ReportRecord], cls: type[Any]) -> list[Any]:
    return [r for r in records if isinstance(r, cls)]


def refine(failure: Failure | None, attempt_dir: Path) -> Failure | None:
    """The attempt's failure with what the job's guard reported (see the module docstring)."""
    if failure is None or failure.kind in {FailureKind.INTERRUPTED, FailureKind.TEARDOWN}:
        return failure
    records = read_report(report_path(attempt_dir)).records
    quits: list[InProcessGaveUp] = _typed(records, InProcessGaveUp)
    armed = bool(_typed(records, InProcessGuard))
    evidence = list(failure.evidence)
    for q in quits:
        evidence.append(
            f"rank {q.rank}: in-process recovery gave up at step {q.step} ({q.reason}: "
            f"{q.detail}); exited {q.exit_code} for dssup to take over"
        )
    if quits and all(q.reason in _BYSTANDER for q in quits):
        silent = sorted(
            {r.rank for r in records if isinstance(r, InProcessGuard)} - {q.rank for q in quits}
        )
        evidence.append(
            f"the guards gave up because a peer left mid-step; rank(s) {silent} reported "
            "nothing (killed or crashed without a traceback)"
        )
    exited = [r.rank for r in failure.ranks if r.exit_code == GAVE_UP_EXIT]
    if exited and not quits:
        evidence.append(f"rank(s) {exited} exited {GAVE_UP_EXIT}: a step guard gave up unsaid")
    if armed and not quits:
        evidence.append(
            "in-process recovery did not act: the job's step guard was armed, but this "
            "failure is not one a rank survives (every rank must be alive to agree)"
        )
    update: dict[str, Any] = {"evidence": tuple(evidence)}
    oom = next((q for q in quits if q.error and (s := match(q.error)) and s.kind.is_oom), None)
    if failure.kind == FailureKind.TRANSIENT and oom is not None:
        sig = match(oom.error)
        update.update(
            kind=sig.kind if sig else failure.kind,
            rank=oom.rank,
            message=oom.error,
            signature=f"inprocess-{oom.reason}",
            phase=oom.phase if oom.phase in {"forward", "backward"} else failure.phase,
        )
    return failure.model_copy(update=update)


def _decisions(remedies: list[InProcessRemedy]) -> list[dict[str, Any]]:
    """One entry per agreed decision (every rank reports the same one)."""
    found: dict[tuple[int, int, int], dict[str, Any]] = {}
    for r in remedies:
        key = (r.step, r.old_micro_batch, r.micro_batch)
        d = found.setdefault(
            key,
            {
                "step": r.step, "old_micro_batch": r.old_micro_batch,
                "old_grad_accum": r.old_grad_accum, "micro_batch": r.micro_batch,
                "grad_accum": r.grad_accum, "dp": r.dp, "global_batch": r.global_batch,
                "oom_ranks": list(r.oom_ranks), "oom_phases": list(r.oom_phases),
                "reported_by": [], "errors": {}, "lost_s": 0.0,
            },
        )  # fmt: skip
        d["reported_by"].append(r.rank)
        d["lost_s"] = max(d["lost_s"], r.lost_s)
        if r.error:
            d["errors"][str(r.rank)] = r.error
    return list(found.values())


def _split_plan(plan: TrainingPlan, micro_batch: int, grad_accum: int, gb: int) -> TrainingPlan:
    update: dict[str, Any] = {"micro_batch": micro_batch, "grad_accum": grad_accum}
    if plan.global_batch is None:
        update["global_batch"] = gb
    return plan.model_copy(update=update)


def absorb(
    journal: Journal,
    attempt: int,
    records: Sequence[dict[str, Any]],
    state: RunState,
    failure: Failure | None,
) -> None:
    """Journal the attempt's in-process recovery and move the run's plan to the job's split."""
    typed = [parse_record(doc) for doc in records if str(doc.get("type", "")).startswith("inp")]
    decisions = _decisions(_typed(typed, InProcessRemedy))
    for d in decisions:
        journal.append("inprocess-remedy", attempt=attempt, **d)
    quits: list[InProcessGaveUp] = _typed(typed, InProcessGaveUp)
    if quits:
        q = quits[0]
        journal.append(
            "inprocess-gave-up", attempt=attempt, source="job", reason=q.reason,
            detail=q.detail, step=q.step, phase=q.phase, micro_batch=q.micro_batch,
            grad_accum=q.grad_accum, ranks=sorted({x.rank for x in quits}),
            reasons={str(x.rank): x.reason for x in quits}, error=q.error, exit_code=q.exit_code,
        )  # fmt: skip
    elif (
        failure is not None
        and failure.kind
        not in {FailureKind.INTERRUPTED, FailureKind.TEARDOWN, FailureKind.UNVERIFIED_END}
        and _typed(typed, InProcessGuard)
    ):
        where = f" on rank {failure.rank}" if failure.rank is not None else ""
        journal.append(
            "inprocess-gave-up", attempt=attempt, source="supervisor",
            reason="not-recoverable-in-process",
            detail=f"{failure.kind}{where}: {failure.message[:200]}; in-process recovery "
            "needs every rank alive and the failure inside a guarded micro-batch",
        )  # fmt: skip
    _move_plan(journal, attempt, decisions, quits, state, failure)


def _move_plan(
    journal: Journal,
    attempt: int,
    decisions: list[dict[str, Any]],
    quits: list[InProcessGaveUp],
    state: RunState,
    failure: Failure | None,
) -> None:
    if not decisions:
        return
    last = max(decisions, key=lambda d: (d["step"], -d["micro_batch"]))
    old = state.plan
    tried = [
        _split_plan(old, d["old_micro_batch"], d["old_grad_accum"], d["global_batch"])
        for d in decisions
    ]
    new = _split_plan(old, last["micro_batch"], last["grad_accum"], last["global_batch"])
    if failure is not None and failure.kind.is_oom and quits:
        tried.append(new)  # the split the job ended on failed too
    changes = {k: list(v) for k, v in new.changes_from(old).items()}
    journal.append(
        "decision", action="in-process", after_attempt=attempt, step="in-process",
        reason=f"the job moved in-process to micro-batch {new.micro_batch} x accumulation "
        f"{new.grad_accum} (global batch {new.global_batch}); the next attempt starts there",
        plan=new.model_dump(mode="json"), changes=changes,
        tried_add=sorted({p.key() for p in tried}),
    )  # fmt: skip
    state.plan = new
    state.tried.update(p.key() for p in tried)
