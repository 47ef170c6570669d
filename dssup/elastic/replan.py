"""Re-planning when the world size changes, before the next attempt starts.

When a node leaves (or joins) the per-rank share of the global batch changes; a naive restart
keeps every knob and only fixes the accumulation. Under ZeRO (and expert parallelism) a smaller
world also means bigger shards per GPU, so the naive restart may not fit where the old world
did. ``replan`` keeps the global batch exact and, with a memory model, checks the naive plan
first and raises ZeRO / recompute / offload (or lowers the micro-batch) *pre-emptively* when it
would not fit; on growth it relaxes back toward the user's own plan when that fits again.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.elastic.batch import divisors, dp_size
from dssup.elastic.fit import MemoryContext, search_plans
from dssup.elastic.models import OFFLOADS, RECOMPUTES, BatchPlan
from dssup.memory.capacity import Band, near_words

__all__ = ["Action", "Replan", "replan", "rescale"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Action = Literal["keep", "rescale", "relax", "raise-memory", "incompatible", "no-fit"]
Knobs = tuple[int, int, str, int, str]


class Replan(BaseModel):
    """The verdict for the next world size: data, never an exception."""

    model_config = _FROZEN
    action: Action = Field(description="what changed beyond the accumulation")
    plan: BatchPlan | None = Field(description="the plan to run; None when impossible")
    naive: BatchPlan | None = Field(description="same knobs, accumulation fixed up")
    reason: str
    predicted_peak_bytes: int | None = Field(None, description="memory model, for ``plan``")
    naive_peak_bytes: int | None = Field(None, description="memory model, for ``naive``")
    budget_bytes: int | None = Field(None, description="GPU memory minus the margin")

    def changes(self) -> dict[str, tuple[object, object]]:
        """Fields of ``plan`` that differ from ``naive``: the pre-emptive part."""
        if self.plan is None or self.naive is None:
            return {}
        a, b = self.naive.model_dump(), self.plan.model_dump()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


def rescale(src: BatchPlan, world_size: int) -> BatchPlan | None:
    """``src``'s knobs at ``world_size``: same model parallelism, the largest micro-batch not
    above ``src``'s that divides the new share; None when the batch cannot stay exact."""
    dp = dp_size(world_size, src.model_parallel)
    if dp is None or src.global_batch % dp:
        return None
    share = src.global_batch // dp
    mb = max(d for d in divisors(share) if d <= src.micro_batch)
    return src.model_copy(
        update={"micro_batch": mb, "grad_accum": share // mb, "dp": dp, "world_size": world_size}
    )


def _incompatible(current: BatchPlan, world: int) -> Replan:
    reason = (
        f"world {world} cannot keep the global batch {current.global_batch} exact "
        f"(model parallel {current.model_parallel})"
    )
    return Replan(action="incompatible", plan=None, naive=None, reason=reason)


def replan(
    current: BatchPlan,
    world_size: int,
    *,
    baseline: BatchPlan | None = None,
    memory: MemoryContext | None = None,
    exclude: Collection[Knobs] = (),
) -> Replan:
    """The plan for ``world_size``. ``baseline`` is the user's own plan (relaxed back to when
    it fits again); ``exclude`` holds knob tuples that already failed at this world size."""
    naive = rescale(current, world_size)
    if naive is None:
        return _incompatible(current, world_size)
    same = world_size == current.world_size
    if memory is None:
        action: Action = "keep" if same else "rescale"
        reason = "no memory model: same knobs, accumulation adjusted" if not same else "unchanged"
        return Replan(action=action, plan=naive, naive=naive, reason=reason)
    return _with_memory(current, naive, baseline, memory, set(exclude), same)


def _verdict(
    action: Action, plan: BatchPlan | None, reason: str, peak: int | None, naive: BatchPlan,
    naive_peak: int, budget: int,
) -> Replan:  # fmt: skip
    return Replan(
        action=action, plan=plan, naive=naive, reason=reason, predicted_peak_bytes=peak,
        naive_peak_bytes=naive_peak, budget_bytes=budget,
    )  # fmt: skip


def _with_memory(
    current: BatchPlan,
    naive: BatchPlan,
    baseline: BatchPlan | None,
    ctx: MemoryContext,
    exclude: set[Knobs],
    same: bool,
) -> Replan:
    budget, naive_peak = ctx.budget, ctx.peak(naive)
    base = rescale(baseline, naive.world_size) if baseline is not None else None
    if base is not None and base != naive and base.knobs() not in exclude:
        peak = ctx.peak(base)
        if peak <= budget:
            reason = f"the user's plan fits again: {base.describe()} peaks at {peak} B"
            reason += ctx.near_note(base)
            return _verdict("relax", base, reason, peak, naive, naive_peak, budget)
    if naive_peak <= budget and naive.knobs() not in exclude:
        reason = f"{naive.describe()} peaks at {naive_peak} B of {budget} B{ctx.near_note(naive)}"
        action: Action = "keep" if same else "rescale"
        return _verdict(action, naive, reason, naive_peak, naive, naive_peak, budget)
    return _raise(current, naive, ctx, exclude, naive_peak)


def _raise(
    current: BatchPlan, naive: BatchPlan, ctx: MemoryContext, exclude: set[Knobs], naive_peak: int
) -> Replan:
    """Search only configs at least as memory-saving as the current one (never lower ZeRO,
    recompute or offload pre-emptively), cheapest first."""
    zero = [z for z in ctx.zero_stages if z >= current.zero_stage]
    rc = RECOMPUTES[RECOMPUTES.index(current.recompute) :]
    levels = [r for r in ctx.recompute if r in rc]
    offloads = OFFLOADS[OFFLOADS.index(current.offload) :]
    found = search_plans(
        ctx, naive.world_size, naive.global_batch,
        zero_stages=zero, recompute=levels, offloads=offloads,
    )  # fmt: skip
    for fit in found:
        if fit.plan.knobs() in exclude:
            continue
        reason = (
            f"at world {naive.world_size} the current knobs would peak at {naive_peak} B "
            f"(budget {ctx.budget} B): {fit.plan.describe()} peaks at {fit.peak_bytes} B"
        )
        if fit.near is not None:
            reason += "; " + near_words(Band(fit.near.fraction, fit.near.source))
        return _verdict(
            "raise-memory", fit.plan, reason, fit.peak_bytes, naive, naive_peak, ctx.budget
        )
    reason = (
        f"nothing fits at world {naive.world_size}: the current knobs peak at {naive_peak} B "
        f"of {ctx.budget} B and no stronger ZeRO/recompute/offload helps"
    )
    return _verdict("no-fit", None, reason, None, naive, naive_peak, ctx.budget)
