"""The supervisor's side of re-planning for a new world size, through ``dssup.elastic``.

Converts between the supervisor's ``TrainingPlan`` and elastic's ``BatchPlan``, builds the
memory context from the memory-model rung when ``--model`` was given (with the calibration it
learnt from real failures, and only the knobs some adapter can carry out), and turns configs
that already failed into exclusions, so a shrink never walks back into a known OOM.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from dssup.elastic import BatchPlan, MemoryContext, Replan, replan
from dssup.memory import Overheads
from dssup.supervisor.modelplan import ModelStep
from dssup.supervisor.models import TrainingPlan
from dssup.supervisor.remedies import RemedyPlanner

__all__ = ["memory_context", "rescale_plan", "to_batch"]

_FIELDS = ("micro_batch", "grad_accum", "global_batch", "dp", "world_size")


def to_batch(plan: TrainingPlan) -> BatchPlan | None:
    """None when the plan does not pin the batch triple (nothing to keep exact)."""
    if any(getattr(plan, f) is None for f in _FIELDS):
        return None
    recompute = plan.recompute if plan.recompute in {"none", "selective", "full"} else "none"
    offload = plan.offload if plan.offload in {"none", "optimizer", "optimizer+params"} else "none"
    return BatchPlan.model_validate(
        {
            **{f: getattr(plan, f) for f in _FIELDS},
            "recompute": recompute,
            "zero_stage": plan.zero_stage,
            "offload": offload,
        }
    )


def memory_context(planner: RemedyPlanner, capabilities: frozenset[str]) -> MemoryContext | None:
    """From the memory-model rung (``ModelStep``) when the run has one."""
    for step in planner.steps:
        if not isinstance(step, ModelStep):
            continue
        return MemoryContext(
            model=step.model,
            layout=step.layout,
            base=step.base,
            gpu_memory_bytes=step.gpu_memory_bytes,
            overheads=Overheads(calibration_bytes=step.calibration_bytes),
            margin=step.margin,
            zero_stages=(0, 1, 2, 3) if "zero_stage" in capabilities else (),
            allow_offload="offload" in capabilities,
            topology=step.topology,
        )
    return None


def _exclusions(tried: Iterable[str], dp: int) -> set[tuple[int, int, str, int, str]]:
    out = set()
    for key in tried:
        try:
            plan = TrainingPlan.model_validate(json.loads(key))
            bp = to_batch(plan.model_copy(update={"world_size": plan.dp}))
        except ValueError:
            continue
        if bp is not None and plan.dp == dp:
            out.add(bp.knobs())
    return out


def rescale_plan(
    plan: TrainingPlan,
    baseline: TrainingPlan,
    world_size: int,
    memory: MemoryContext | None,
    tried: Iterable[str] = (),
) -> tuple[TrainingPlan, Replan | None]:
    """The plan for ``world_size``; unchanged (with a None verdict) when the batch is not pinned."""
    current = to_batch(plan)
    if current is None:
        return plan.model_copy(update={"world_size": world_size}), None
    if memory is not None and not memory.zero_stages:
        memory = memory.model_copy(update={"zero_stages": (plan.zero_stage,)})
    dp_new = world_size // current.model_parallel
    verdict = replan(
        current,
        world_size,
        baseline=to_batch(baseline),
        memory=memory,
        exclude=_exclusions(tried, dp_new),
    )
    chosen = verdict.plan or verdict.naive
    if chosen is None:
        return plan, verdict
    return plan.model_copy(update=chosen.model_dump()), verdict
