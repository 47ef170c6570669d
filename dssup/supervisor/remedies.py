"""The remedy ladder: from a failure and the current plan to the cheapest change that should fit.

Rungs, cheapest first: load checkpoints to the CPU (an OOM while loading), the allocator's
expandable segments (when the memory PyTorch reserved but did not use would have covered the
request), then either the memory model's plan (``ModelStep``, when a model description was
given) or, from the failure alone, halving the micro-batch with doubled accumulation and
raising recompute; then any adapter rungs (DeepSpeed: ZeRO stage, offload). An adapter rung
with an ``attach_model`` method is handed the memory-model rung, so it can predict its own
options with the same model description. An OOM in the optimizer step tries the adapter rungs
first: a smaller micro-batch does not shrink it. The global batch is exact on every rung, and
no rung ever proposes a config that already failed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from dssup.supervisor.adapters import RemedyContext, RemedyStep
from dssup.supervisor.models import Failure, FailureKind, Remedy, TrainingPlan

__all__ = [
    "AllocConfStep",
    "HalveMicroBatchStep",
    "LoadToCpuStep",
    "RaiseRecomputeStep",
    "RemedyPlanner",
    "no_remedy_reason",
    "per_rank_share",
]

log = logging.getLogger(__name__)
_RECOMPUTE = ("none", "selective", "full")


def per_rank_share(plan: TrainingPlan) -> int | None:
    """Samples per data-parallel rank per optimizer step (micro-batch x accumulation)."""
    if plan.global_batch is not None and plan.global_batch % plan.dp == 0:
        return plan.global_batch // plan.dp
    if plan.micro_batch is not None and plan.grad_accum is not None:
        return plan.micro_batch * plan.grad_accum
    return None


def _fresh(plan: TrainingPlan, ctx: RemedyContext) -> bool:
    return plan.key() not in ctx.tried


def _activation_oom(failure: Failure, ctx: RemedyContext) -> bool:
    """An OOM that a smaller micro-batch or more recompute can fix."""
    if failure.kind == FailureKind.CUDA_OOM:
        return True
    return failure.kind == FailureKind.HOST_OOM and ctx.device == "cpu"


class LoadToCpuStep:
    name = "load-to-cpu"

    def propose(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        if failure.kind != FailureKind.LOAD_OOM or plan.load_to_cpu:
            return None
        new = plan.model_copy(update={"load_to_cpu": True})
        reason = "the OOM happened while loading the checkpoint: load it to the CPU first"
        return Remedy(step=self.name, plan=new, reason=reason) if _fresh(new, ctx) else None


class AllocConfStep:
    name = "alloc-conf"

    def propose(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        tried, spare = failure.tried_to_allocate, failure.reserved_unallocated
        if failure.kind != FailureKind.CUDA_OOM or plan.expandable_segments:
            return None
        if tried is None or spare is None or spare < tried:
            return None
        new = plan.model_copy(update={"expandable_segments": True})
        reason = (
            f"{spare} bytes were reserved but unallocated, enough for the {tried}-byte request: "
            "fragmentation, so set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        )
        return Remedy(step=self.name, plan=new, reason=reason) if _fresh(new, ctx) else None


def _recompute_left(plan: TrainingPlan, ctx: RemedyContext) -> bool:
    """A higher recompute level this script can receive and that was not tried."""
    if "recompute" not in ctx.capabilities or plan.recompute not in _RECOMPUTE:
        return False
    higher = _RECOMPUTE[_RECOMPUTE.index(plan.recompute) + 1 :]
    return any(ctx.usable(plan.model_copy(update={"recompute": r})) for r in higher)


class HalveMicroBatchStep:
    name = "halve-micro-batch"
    activation_only = True  # helps activation peaks only; see RemedyPlanner.ordered

    def propose(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        share = per_rank_share(plan)
        if not _activation_oom(failure, ctx) or share is None or plan.micro_batch is None:
            return None
        # Before the first checkpoint every failure restarts from step 0: try recompute before
        # the slowest split of all (micro-batch 1).
        floor = 2 if not ctx.progress_saved and _recompute_left(plan, ctx) else 1
        for mb in range(plan.micro_batch // 2, floor - 1, -1):
            if share % mb:
                continue
            new = plan.model_copy(update={"micro_batch": mb, "grad_accum": share // mb})
            if _fresh(new, ctx):
                reason = (
                    f"micro-batch {plan.micro_batch} -> {mb}, accumulation "
                    f"{plan.grad_accum} -> {share // mb}: activations halve, global batch "
                    f"stays {plan.global_batch or share * plan.dp}"
                )
                return Remedy(step=self.name, plan=new, reason=reason)
        return None


class RaiseRecomputeStep:
    name = "recompute"
    activation_only = True

    def propose(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        if not _activation_oom(failure, ctx) or plan.recompute not in _RECOMPUTE:
            return None
        for level in _RECOMPUTE[_RECOMPUTE.index(plan.recompute) + 1 :]:
            new = plan.model_copy(update={"recompute": level})
            if _fresh(new, ctx):
                reason = f"recompute {plan.recompute} -> {level}: activations are recomputed"
                return Remedy(step=self.name, plan=new, reason=reason)
        return None


@dataclass
class RemedyPlanner:
    """Walks the rungs in order; the first fresh proposal the hand-off accepts wins. What was
    passed over, and why, is in ``skipped`` after each ``decide``."""

    steps: Sequence[RemedyStep]
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def default(
        cls, model_step: RemedyStep | None = None, extra: Sequence[RemedyStep] = ()
    ) -> RemedyPlanner:
        # With a model description the memory model plans first; the built-in rungs still
        # follow (when the model finds nothing that fits, the failure itself guides the ladder).
        builtin: list[RemedyStep] = [HalveMicroBatchStep(), RaiseRecomputeStep()]
        batch: list[RemedyStep] = [model_step, *builtin] if model_step else builtin
        for step in extra if model_step is not None else ():
            attach = getattr(step, "attach_model", None)  # e.g. the DeepSpeed rung
            if callable(attach):
                attach(model_step)
        return cls([LoadToCpuStep(), AllocConfStep(), *batch, *extra])

    def ordered(self, failure: Failure) -> list[RemedyStep]:
        """The rungs to try for ``failure``: an OOM in the optimizer step holds no activations,
        so rungs that only shrink activations go last, after ZeRO/offload rungs."""
        if failure.phase != "optimizer":
            return list(self.steps)
        late = [s for s in self.steps if getattr(s, "activation_only", False)]
        return [s for s in self.steps if s not in late] + late

    def decide(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        self.skipped = []
        for step in self.ordered(failure):
            remedy = self._from(step, failure, plan, ctx)
            note = getattr(step, "note", None)
            if note:
                self.skipped.append(f"{step.name}: {note}")
            if remedy is not None:
                return remedy
        return None

    def _from(
        self, step: RemedyStep, failure: Failure, plan: TrainingPlan, ctx: RemedyContext
    ) -> Remedy | None:
        """The step's first proposal the hand-off accepts (refused ones count as tried)."""
        tried = set(ctx.tried)
        for _ in range(64):
            remedy = step.propose(failure, plan, replace(ctx, tried=frozenset(tried)))
            if remedy is None or remedy.plan.key() in tried:
                return None
            if remedy.plan.global_batch != plan.global_batch:
                log.error("rung %s changed the global batch; ignored", step.name)
                return None
            why = ctx.check(remedy.plan) if ctx.check is not None else None
            if why is None:
                return remedy
            self.skipped.append(f"{step.name} ({remedy.plan.describe()}): {why.reason}")
            if why.unreachable:
                return None
            tried.add(remedy.plan.key())
        return None


def no_remedy_reason(failure: Failure, plan: TrainingPlan, skipped: Sequence[str] = ()) -> str:
    """Why the ladder gave up, with every remedy it passed over and why."""
    if failure.kind.is_oom and plan.micro_batch is None:
        return (
            f"no untried remedy for {failure.kind}: the micro-batch is unknown; pass "
            "--global-batch-size and --micro-batch-size (or a model with --model)"
        )
    if failure.kind == FailureKind.COMM_OOM:
        return "out of memory inside a collective: a smaller micro-batch barely helps; no remedy"
    why = f"; passed over: {'; '.join(skipped)}" if skipped else ""
    return f"no untried remedy for {failure.kind} (all rungs tried or not applicable){why}"
