"""The memory-model rung: plan the next attempt with ``dssup.memory``, calibrated to the failure.

Given a model description, the rung first *calibrates*: the config that just failed is
estimated, and when the model predicted less than the failure shows (the bytes in use plus the
failed request, or at least the whole device), the difference becomes
``Overheads.calibration_bytes`` for every later estimate. Then ``dssup.memory.plan`` searches the
configs that keep the layout and the global batch, limited to the knobs some adapter can carry
out (ZeRO and offload only with DeepSpeed), and the cheapest one that fits (``dssup.memory.
capacity``: no margin unless the user asks for one) and has not failed before is proposed; a
proposal within the memory model's uncertainty of the limit says so, with the band's source. After an OOM in the optimizer step only configs
that change what the step holds (ZeRO stage, offload) qualify: the model's calibration shifts
every config alike, so a smaller micro-batch would look as if it fitted while the failing
allocation (optimizer states, gradient partitions) stays the same size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from dssup.memory import (
    Candidate,
    Layout,
    ModelSpec,
    Overheads,
    PlanRequest,
    PlanResult,
    Training,
)
from dssup.memory import estimate as estimate_memory
from dssup.memory import plan as plan_memory
from dssup.memory.capacity import DEFAULT_MARGIN, Band, margin_words, near_words
from dssup.memory.topology import Topology
from dssup.supervisor.adapters import RemedyContext
from dssup.supervisor.models import Failure, FailureKind, Remedy, TrainingPlan

__all__ = ["ModelStep", "to_training"]

log = logging.getLogger(__name__)
_OFFLOAD = {(False, False): "none", (True, False): "optimizer", (True, True): "optimizer+params"}


def to_training(plan: TrainingPlan, base: Training) -> Training:
    """The memory model's view of a supervisor plan (``base`` supplies seq_len, precision)."""
    return base.model_copy(
        update={
            "micro_batch": plan.micro_batch or 1,
            "grad_accum": plan.grad_accum or 1,
            "recompute": plan.recompute
            if plan.recompute in {"none", "selective", "full"}
            else "none",
            "zero_stage": plan.zero_stage,
            "offload_optimizer": plan.offload != "none",
            "offload_params": plan.offload == "optimizer+params",
        }
    )


def _from_candidate(c: Candidate, plan: TrainingPlan) -> TrainingPlan:
    t = c.training
    return plan.model_copy(
        update={
            "micro_batch": t.micro_batch,
            "grad_accum": t.grad_accum,
            "recompute": t.recompute,
            "zero_stage": t.zero_stage,
            "offload": _OFFLOAD[(t.offload_optimizer, t.offload_params)],
        }
    )


def _helps(failure: Failure, old: TrainingPlan, new: TrainingPlan) -> bool:
    """Whether ``new`` can shrink what failed: at the optimizer step only ZeRO and offload do."""
    if failure.phase != "optimizer":
        return True
    return (new.zero_stage, new.offload) != (old.zero_stage, old.offload)


@dataclass
class ModelStep:
    """Plans with the memory model. ``calibration_bytes`` only grows, and is journalled."""

    model: ModelSpec
    layout: Layout
    base: Training
    gpu_memory_bytes: int
    margin: float = DEFAULT_MARGIN  # extra fraction kept free (``dssup run --margin``)
    topology: Topology | None = None  # the GPU the step times are for; None: an H100 node
    calibration_bytes: int = 0
    name: str = "memory-model"
    history: list[int] = field(default_factory=list)
    note: str | None = None  # why the last proposal was None (journalled by the planner)

    def observed_peak(self, failure: Failure) -> int:
        """A lower bound on what the failed config really needed."""
        seen = self.gpu_memory_bytes
        if failure.in_use_bytes is not None and failure.tried_to_allocate is not None:
            seen = max(seen, failure.in_use_bytes + failure.tried_to_allocate)
        elif failure.total_bytes is not None and failure.free_bytes is not None:
            used = failure.total_bytes - failure.free_bytes
            seen = max(seen, used + (failure.tried_to_allocate or 0))
        return seen

    def calibrate(self, failure: Failure, plan: TrainingPlan) -> int:
        layout = self.layout.model_copy(update={"dp": plan.dp})
        predicted = estimate_memory(
            self.model, layout, to_training(plan, self.base), Overheads()
        ).peak_bytes
        shift = max(0, self.observed_peak(failure) - predicted)
        if shift > self.calibration_bytes:
            log.info(
                "calibration: predicted %s B, observed at least %s B", predicted, predicted + shift
            )
            self.calibration_bytes = shift
        self.history.append(self.calibration_bytes)
        return self.calibration_bytes

    def propose(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        self.note = None
        if (
            failure.kind not in {FailureKind.CUDA_OOM, FailureKind.HOST_OOM}
            or plan.global_batch is None
        ):
            return None
        if failure.kind == FailureKind.HOST_OOM and ctx.device != "cpu":
            return None
        calibration = self.calibrate(failure, plan)
        zero = (0, 1, 2, 3) if "zero_stage" in ctx.capabilities else (plan.zero_stage,)
        req = PlanRequest(
            model=self.model,
            gpu_memory_bytes=self.gpu_memory_bytes,
            global_batch=plan.global_batch,
            world_size=plan.world_size,
            layout=self.layout,
            training=to_training(plan, self.base),
            overheads=Overheads(calibration_bytes=calibration),
            zero_stages=zero,
            allow_offload="offload" in ctx.capabilities,
            margin=self.margin,
            topology=self.topology,
            limit=200,
        )
        result = plan_memory(req)
        if not result.candidates:
            self.note = self._nothing_fits(result, calibration)
            return None
        for cand in result.candidates:
            new = _from_candidate(cand, plan)
            if new.key() in ctx.tried or new == plan or not _helps(failure, plan, new):
                continue
            reason = (
                f"memory model (calibrated +{calibration} B): {new.describe()} peaks at "
                f"{cand.peak_bytes} B of {self.gpu_memory_bytes} B {margin_words(self.margin)}"
            )
            if cand.near_limit and result.bands:
                b = result.bands[0]
                reason += f"; {near_words(Band(b.fraction, b.source))}"
            return Remedy(
                step=self.name,
                plan=new,
                reason=reason,
                predicted_peak_bytes=cand.peak_bytes,
                calibration_bytes=calibration,
            )
        self.note = "every config the memory model finds fitting was tried or cannot help"
        return None

    def _nothing_fits(self, result: PlanResult, calibration: int) -> str:
        """The verdict in GiB: capacity, margin, calibration and the closest miss."""
        text = (
            f"the memory model finds nothing that fits {_gib(self.gpu_memory_bytes)} GiB "
            f"{margin_words(self.margin)} (calibrated +{_gib(calibration)} GiB from the failure)"
        )
        c = result.closest
        if c is not None:
            t = c.training
            text += (
                f"; closest: micro-batch {t.micro_batch} x accumulation {t.grad_accum}, recompute "
                f"{t.recompute}, ZeRO-{t.zero_stage} needs {_gib(c.peak_bytes)} GiB "
                f"({_gib(-c.headroom_bytes)} GiB over)"
            )
        return text + "; the built-in ladder goes on from the failure itself"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f}"
