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

Which of the options wins is decided by its predicted saving at the failure's phase
(``choice``, ``savings``): with a model description (``dssup run --model``, handed to this rung
by ``RemedyPlanner.default`` through ``attach_model``) the memory model estimates every option;
without one, an optimizer, load or init failure is scored from the parameter count in the job's
latest checkpoint; otherwise the static order above applies, and the journal says which of the
three decided. When a prediction is available, ZeRO-2 is scored at the optimizer step too (and
predicted to save nothing there), so the journal shows why it lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dssup.supervisor.adapters import RemedyContext
from dssup.supervisor.deepspeed.choice import Option, choose
from dssup.supervisor.deepspeed.savings import MemoryContext, ParamContext
from dssup.supervisor.modelplan import ModelStep
from dssup.supervisor.models import Failure, Remedy, TrainingPlan

__all__ = ["DeepSpeedStep", "MemoryContext", "Option", "options_for"]

# Cheapest first (throughput cost); the name is the journal's rung name.
_COST_ORDER = ("recompute", "zero-1", "zero-2", "zero-3", "offload-optimizer", "offload-params")


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


# Scored (a prediction is available): ZeRO-2 is a candidate at the step too, predicted to lose.
_SCORED = {"optimizer": ("zero-1", "zero-2", "offload-optimizer", "zero-3", "offload-params")}


def options_for(
    phase: str, plan: TrainingPlan, device: str = "cuda", scored: bool = False
) -> list[Option]:
    """The options that can help an OOM in ``phase``, in static cost order."""
    every = _all_options(plan)
    names = (_SCORED if scored else _BY_PHASE).get(phase) or _BY_PHASE.get(phase, _COST_ORDER)
    if device == "cpu":
        names = tuple(n for n in names if not n.startswith("offload"))
    return [every[n] for n in names if n in every]


@dataclass
class DeepSpeedStep:
    """The DeepSpeed rung (``RemedyStep`` protocol): one option per failure, never a repeat.

    ``memory`` (a model description) or ``params`` (reads the job's latest checkpoint) supply
    the predictions; with neither the static order decides.
    """

    memory: MemoryContext | None = None
    params: Callable[[], ParamContext | None] | None = None
    name: str = "deepspeed"

    def attach_model(self, step: ModelStep) -> None:
        """Use the memory-model rung's description (``dssup run --model``) for predictions."""
        self.memory = MemoryContext(
            model=step.model, layout=step.layout, base=step.base,
            gpu_memory_bytes=step.gpu_memory_bytes, margin=step.margin, topology=step.topology,
        )  # fmt: skip

    def propose(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        if not failure.kind.is_oom:
            return None
        allowed = {"zero_stage", "offload"} <= ctx.capabilities
        params = self.params() if self.params is not None and self.memory is None else None
        scored = self.memory is not None or params is not None
        options = options_for(failure.phase, plan, ctx.device, scored=scored)
        fresh = [o for o in options if o.plan.key() not in ctx.tried]
        fresh = [o for o in fresh if allowed or o.name == "recompute"]
        picked = choose(failure, plan, fresh, self.memory, params)
        if picked is None:
            return None
        option = picked.option
        reason = f"{failure.phase or 'unknown-phase'} OOM: {option.why}; {picked.how}"
        return Remedy(
            step=f"deepspeed:{option.name}",
            plan=option.plan,
            reason=reason,
            predicted_peak_bytes=picked.predicted_peak,
        )
