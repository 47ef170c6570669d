"""The memory side of elasticity: does a batch plan fit a GPU at a given world size?

Thin glue over ``dssup.memory.estimate`` and ``dssup.memory.plan``: a ``MemoryContext`` holds
what does not change when nodes come and go (model, TP/PP/EP layout, sequence length, GPU size,
calibration learnt from real failures), and the helpers here evaluate or search ``BatchPlan``s
for any world size. A smaller world means bigger ZeRO shards and bigger expert-data-parallel
groups per GPU, which is exactly what the memory model's ZeRO terms capture.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from dssup.elastic.models import OFFLOADS, RECOMPUTES, BatchPlan, Offload, Recompute
from dssup.memory import (
    Candidate,
    Estimate,
    Layout,
    ModelSpec,
    Overheads,
    PlanRequest,
    Training,
)
from dssup.memory import estimate as estimate_memory
from dssup.memory import plan as plan_memory
from dssup.memory.capacity import DEFAULT_MARGIN, Band, budget, near_words
from dssup.memory.config import Convention
from dssup.memory.plan_types import BandInfo
from dssup.memory.topology import Topology

__all__ = ["Fitted", "MemoryContext", "search_plans"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_OFFLOAD_OF: dict[tuple[bool, bool], Offload] = {
    (False, False): "none",
    (True, False): "optimizer",
    (True, True): "optimizer+params",
}


class MemoryContext(BaseModel):
    """Everything about memory that stays fixed while the world size changes."""

    model_config = _FROZEN
    model: ModelSpec
    layout: Layout = Field(default_factory=Layout, description="TP/PP/EP/CP; dp is derived")
    base: Training = Field(default_factory=Training, description="seq_len, precision, ...")
    gpu_memory_bytes: int = Field(gt=0, description="usable memory per GPU, bytes")
    overheads: Overheads | None = Field(None, description="None = convention defaults")
    convention: Convention = "megatron"
    margin: float = Field(
        DEFAULT_MARGIN,
        ge=0,
        lt=1,
        description="extra fraction of GPU memory kept free; default none (capacity.py)",
    )
    zero_stages: tuple[int, ...] = Field((0, 1, 2, 3), description="stages the job can use")
    recompute: tuple[Recompute, ...] = Field(RECOMPUTES, description="levels the job can use")
    allow_offload: bool = Field(True, description="the job can offload to host memory")
    topology: Topology | None = Field(
        None, description="GPU the planner's step times are for; None: an H100 node"
    )

    @property
    def model_parallel(self) -> int:
        return self.layout.tp * self.layout.pp * self.layout.cp

    @property
    def budget(self) -> int:
        return budget(self.gpu_memory_bytes, self.margin)

    def training(self, bp: BatchPlan) -> Training:
        return self.base.model_copy(
            update={
                "micro_batch": bp.micro_batch,
                "grad_accum": bp.grad_accum,
                "recompute": bp.recompute,
                "zero_stage": bp.zero_stage,
                "offload_optimizer": bp.offload != "none",
                "offload_params": bp.offload == "optimizer+params",
            }
        )

    def estimate(self, bp: BatchPlan) -> Estimate:
        """The memory model's estimate of ``bp`` on this GPU (calibration included)."""
        layout = self.layout.model_copy(update={"dp": bp.dp})
        return estimate_memory(
            self.model,
            layout,
            self.training(bp),
            self.overheads,
            self.convention,
            gpu_memory_bytes=self.gpu_memory_bytes,
        )

    def peak(self, bp: BatchPlan) -> int:
        """Predicted per-GPU peak bytes of ``bp`` (calibration included)."""
        return self.estimate(bp).peak_bytes

    def near_note(self, bp: BatchPlan) -> str:
        """``"; near the limit: ..."`` (the band and its source) when ``bp`` fits within the
        memory model's uncertainty of the GPU, else nothing."""
        est = self.estimate(bp)
        if not est.near_limit or est.uncertainty is None:
            return ""
        return "; " + near_words(Band(est.uncertainty, est.uncertainty_source))

    def fits(self, bp: BatchPlan) -> bool:
        return self.peak(bp) <= self.budget


class Fitted(BaseModel):
    """A plan the memory model says fits, with its predicted peak and step time, and the
    uncertainty band when the peak is within it of the GPU (capacity.py)."""

    model_config = _FROZEN
    plan: BatchPlan
    peak_bytes: int
    step_time_s: float
    near: BandInfo | None = Field(
        None, description="the memory model's band when the peak fits within it of the GPU"
    )


def _to_plan(c: Candidate, global_batch: int, world: int) -> BatchPlan:
    t = c.training
    offload = _OFFLOAD_OF[(t.offload_optimizer, t.offload_params)]
    recompute: Recompute = t.recompute
    return BatchPlan(
        micro_batch=t.micro_batch,
        grad_accum=t.grad_accum,
        global_batch=global_batch,
        dp=c.layout.dp,
        world_size=world,
        recompute=recompute,
        zero_stage=t.zero_stage,
        offload=offload,
    )


def search_plans(
    ctx: MemoryContext,
    world_size: int,
    global_batch: int,
    *,
    micro_batches: Sequence[int] | None = None,
    zero_stages: Sequence[int] | None = None,
    recompute: Sequence[Recompute] | None = None,
    offloads: Sequence[Offload] = OFFLOADS,
    limit: int = 10_000,
) -> list[Fitted]:
    """Every plan that fits at ``world_size``, cheapest first (the memory planner's ranking)."""
    allow_offload = ctx.allow_offload and any(o != "none" for o in offloads)
    req = PlanRequest(
        model=ctx.model,
        gpu_memory_bytes=ctx.gpu_memory_bytes,
        global_batch=global_batch,
        world_size=world_size,
        layout=ctx.layout,
        training=ctx.base,
        overheads=ctx.overheads,
        convention=ctx.convention,
        recompute=tuple(recompute if recompute is not None else ctx.recompute),
        zero_stages=tuple(zero_stages if zero_stages is not None else ctx.zero_stages),
        allow_offload=allow_offload,
        micro_batches=tuple(micro_batches) if micro_batches is not None else None,
        margin=ctx.margin,
        topology=ctx.topology,
        limit=limit,
    )
    res = plan_memory(req)
    band = res.bands[0] if res.bands else None
    out = []
    for cand in res.candidates:
        bp = _to_plan(cand, global_batch, world_size)
        if bp.offload in offloads:
            near = band if cand.near_limit else None
            out.append(
                Fitted(plan=bp, peak_bytes=cand.peak_bytes, step_time_s=cand.step_time_s, near=near)
            )
    return out
