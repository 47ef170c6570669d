"""DeepSpeed rungs of the remedy ladder: ZeRO 0→1→2→3, optimizer offload, parameter offload,
activation checkpointing, chosen by the failure's phase and the memory model's prediction.

Pure: a failure and a plan in, a ``Remedy`` (or None) out. What goes in depends on *where* the
OOM happened (a smaller micro-batch does nothing for an optimizer step):

==============  ===========================================================================
phase           options considered (static order when no memory model is given)
==============  ===========================================================================
optimizer       ZeRO-1 (from 0), optimizer offload, ZeRO-3, parameter offload
backward        activation checkpointing, ZeRO-1, ZeRO-2, ZeRO-3, optimizer offload,
                parameter offload
forward         activation checkpointing, ZeRO-1, ZeRO-3, ZeRO-2, optimizer offload,
                parameter offload
load, init      ZeRO-3, parameter offload, optimizer offload
other / ''      every option, cheapest first
==============  ===========================================================================

Why ZeRO-2 is not an optimizer-step remedy: DeepSpeed (0.19) reduces a ZeRO-1 job's gradients
into each rank's partition at the accumulation boundary and frees the rest *before* the
optimizer step, so at the step ZeRO-1 and ZeRO-2 hold the same; ZeRO-2 differs only between
micro-steps (it reduces every micro-step), which is a backward-phase saving. Measured here:
ZeRO-1 and ZeRO-2 peak within 0.2 % of each other on the example job. Offload options are
dropped when the job's tensors live on the CPU (``ctx.device == "cpu"``): the host *is* the
device there, so offloading saves nothing.

With a memory model (``MemoryContext``: a ``dssup.memory`` model spec, layout, base training and
the device size), every option is estimated; the cheapest (by the static cost order, which
follows ``dssup.memory.cost``: recompute and ZeRO-1/2 are nearly free, ZeRO-3 pays all-gathers,
offload pays PCIe) among those predicted to fit with the margin wins; when none is predicted
to fit, the one with the largest predicted saving. The estimate is first shifted so it matches
what the failure showed (bytes in use plus the failed request), like the generic planner does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dssup.errors import DssupError
from dssup.memory import Layout, ModelSpec, Overheads, Training, estimate
from dssup.supervisor.adapters import RemedyContext
from dssup.supervisor.models import Failure, Remedy, TrainingPlan

__all__ = ["DeepSpeedStep", "MemoryContext", "Option", "options_for"]

# Cheapest first (throughput cost); the name is the journal's rung name.
_COST_ORDER = ("recompute", "zero-1", "zero-2", "zero-3", "offload-optimizer", "offload-params")


@dataclass(frozen=True)
class Option:
    """One candidate change and the plan it leads to."""

    name: str
    plan: TrainingPlan
    why: str


@dataclass(frozen=True)
class MemoryContext:
    """What the memory model needs to predict a DeepSpeed option's peak."""

    model: ModelSpec
    layout: Layout
    base: Training  # seq_len, precision, ... (micro-batch and ZeRO come from the plan)
    gpu_memory_bytes: int
    overheads: Overheads | None = None
    margin: float = 0.05


def _zero(plan: TrainingPlan, stage: int) -> Option:
    why = {
        1: "ZeRO-1 shards the optimizer states over the data-parallel ranks",
        2: "ZeRO-2 also shards the gradients",
        3: "ZeRO-3 also shards the parameters (gathered layer by layer)",
    }[stage]
    return Option(f"zero-{stage}", plan.model_copy(update={"zero_stage": stage}), why)


def _all_options(plan: TrainingPlan) -> dict[str, Option]:
    out = {f"zero-{s}": _zero(plan, s) for s in range(plan.zero_stage + 1, 4)}
    if plan.offload == "none":
        new = plan.model_copy(
            update={"offload": "optimizer", "zero_stage": max(plan.zero_stage, 1)}
        )
        out["offload-optimizer"] = Option(
            "offload-optimizer", new, "optimizer states and the Adam step move to host memory"
        )
    if plan.offload != "optimizer+params":
        new = plan.model_copy(update={"offload": "optimizer+params", "zero_stage": 3})
        out["offload-params"] = Option(
            "offload-params", new, "ZeRO-3 parameters and optimizer states move to host memory"
        )
    if plan.recompute == "none":
        new = plan.model_copy(update={"recompute": "full"})
        out["recompute"] = Option(
            "recompute", new, "activation checkpointing: blocks are recomputed in backward"
        )
    return out


_BY_PHASE: dict[str, tuple[str, ...]] = {
    "optimizer": ("zero-1", "offload-optimizer", "zero-3", "offload-params"),
    "backward": ("recompute", "zero-1", "zero-2", "zero-3", "offload-optimizer", "offload-params"),
    "forward": ("recompute", "zero-1", "zero-3", "zero-2", "offload-optimizer", "offload-params"),
    "load": ("zero-3", "offload-params", "offload-optimizer"),
}
_BY_PHASE["init"] = _BY_PHASE["load"]


def options_for(phase: str, plan: TrainingPlan, device: str = "cuda") -> list[Option]:
    """The options that can help an OOM in ``phase``, in static cost order."""
    every = _all_options(plan)
    names = _BY_PHASE.get(phase, _COST_ORDER)
    if device == "cpu":
        names = tuple(n for n in names if not n.startswith("offload"))
    return [every[n] for n in names if n in every]


def _to_training(plan: TrainingPlan, base: Training) -> Training:
    return base.model_copy(
        update={
            "micro_batch": plan.micro_batch or base.micro_batch,
            "grad_accum": plan.grad_accum or base.grad_accum,
            "recompute": plan.recompute if plan.recompute != "none" else base.recompute,
            "zero_stage": plan.zero_stage,
            "offload_optimizer": plan.offload != "none",
            "offload_params": plan.offload == "optimizer+params",
        }
    )


def _peak(mem: MemoryContext, plan: TrainingPlan) -> int | None:
    try:
        est = estimate(mem.model, mem.layout, _to_training(plan, mem.base), mem.overheads)
    except DssupError:
        return None
    return est.peak_bytes


def _observed(failure: Failure) -> int | None:
    if failure.in_use_bytes is not None and failure.tried_to_allocate is not None:
        return failure.in_use_bytes + failure.tried_to_allocate
    return None


def choose(
    failure: Failure, plan: TrainingPlan, options: Sequence[Option], mem: MemoryContext | None
) -> tuple[Option, int | None, str] | None:
    """Pick one option: (option, predicted peak or None, explanation)."""
    if not options:
        return None
    if mem is None:
        return options[0], None, f"phase {failure.phase or 'unknown'}: cheapest rung that applies"
    now = _peak(mem, plan)
    shift = max(0, (_observed(failure) or 0) - now) if now is not None else 0
    budget = mem.gpu_memory_bytes * (1 - mem.margin)
    scored = [(o, p + shift) for o in options if (p := _peak(mem, o.plan)) is not None]
    fitting = [(o, p) for o, p in scored if p <= budget]
    if fitting:
        o, p = fitting[0]
        return o, p, f"predicted peak {p / 2**30:.2f} GiB fits {budget / 2**30:.2f} GiB"
    if not scored:
        return options[0], None, "the memory model could not estimate these options"
    o, p = min(scored, key=lambda sp: sp[1])
    return o, p, f"nothing predicted to fit; largest saving (predicted {p / 2**30:.2f} GiB)"


@dataclass
class DeepSpeedStep:
    """The DeepSpeed rung (``RemedyStep`` protocol): one option per failure, never a repeat."""

    memory: MemoryContext | None = None
    name: str = "deepspeed"

    def propose(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        if not failure.kind.is_oom:
            return None
        allowed = {"zero_stage", "offload"} <= ctx.capabilities
        options = options_for(failure.phase, plan, ctx.device)
        fresh = [o for o in options if o.plan.key() not in ctx.tried]
        fresh = [o for o in fresh if allowed or o.name == "recompute"]
        picked = choose(failure, plan, fresh, self.memory)
        if picked is None:
            return None
        option, peak, how = picked
        reason = f"{failure.phase or 'unknown-phase'} OOM: {option.why}; {how}"
        return Remedy(
            step=f"deepspeed:{option.name}",
            plan=option.plan,
            reason=reason,
            predicted_peak_bytes=peak,
        )
