"""An explicit, documented cost model used to rank configs that fit.

Step time in seconds on one GPU (all GPUs of a data-parallel job do the same work):

    compute   = 6 * N_active * tokens_per_gpu / (peak_flops * mfu)
                * recompute factor (none 1.00, selective 1.05, full 1.33)
                * (1 + small_batch_tokens / (b * s))          # small micro-batches run slower
                * (1 + (PP - 1) / (m * VPP))                  # pipeline bubble (1F1B)
    zero3     = 2 * m * P_gpu * weight_bytes * (DP-1)/DP / dp_bandwidth
                (parameters all-gathered for forward and backward of every micro-batch)
    offload   = (grad + weight bytes of the shard) / pcie_bandwidth + shard / cpu_adam_rate
                (+ 2 * m * P_gpu * weight_bytes / pcie_bandwidth with parameter offload)

ZeRO 0-2 gradient traffic overlaps with backward and is not charged. The absolute figures
depend on the hardware settings below (H100-class defaults); the ranking is what matters.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dssup.memory.config import Layout, Training

__all__ = [
    "RECOMPUTE_FACTOR",
    "CostCurve",
    "CostModel",
    "cost_at",
    "cost_curve",
    "step_cost",
]


RECOMPUTE_FACTOR = {"none": 1.0, "selective": 1.05, "full": 4.0 / 3.0}


class CostModel(BaseModel):
    """Hardware figures for the cost model."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    peak_flops: float = Field(989e12, gt=0, description="dense BF16 FLOP/s per GPU")
    mfu: float = Field(0.4, gt=0, le=1, description="model FLOP utilisation achieved")
    small_batch_tokens: int = Field(512, ge=0, description="tokens of fixed per-micro-batch cost")
    dp_bandwidth: float = Field(25e9, gt=0, description="bytes/s per GPU for ZeRO-3 all-gathers")
    pcie_bandwidth: float = Field(25e9, gt=0, description="bytes/s host<->device per GPU")
    cpu_adam_rate: float = Field(
        1e9, gt=0, description="parameters/s the host Adam updates per GPU"
    )


def step_cost(
    cm: CostModel,
    layout: Layout,
    training: Training,
    active_params: int,
    gpu_params: int,
    shard_params: int,
    global_batch: int,
    weight_bytes: int,
    grad_bytes: int,
) -> dict[str, float]:
    """Seconds per optimizer step, by term; ``total`` is their sum."""
    t = training
    curve = cost_curve(
        cm,
        layout.pp,
        layout.vpp,
        layout.dp,
        layout.world_size,
        t.seq_len,
        t.recompute,
        t.zero_stage,
        t.offload_optimizer,
        t.offload_params,
        active_params,
        gpu_params,
        global_batch,
        weight_bytes,
        grad_bytes,
    )
    compute, zero3, offload = cost_at(curve, t.micro_batch, t.grad_accum, shard_params)
    return {
        "compute": compute,
        "zero3": zero3,
        "offload": offload,
        "total": compute + zero3 + offload,
    }


class CostCurve(NamedTuple):
    """The cost model with everything but (b, m, shard) folded in: the planner evaluates it
    for thousands of micro-batch sizes with a few multiplications each."""

    base: float  # compute seconds at unit efficiency, recompute factor included
    small_batch: float  # small_batch_tokens / s
    bubble: float  # (PP - 1) / VPP
    zero3_per_m: float
    offload_per_shard: float
    offload_per_m: float


def cost_curve(
    cm: CostModel,
    pp: int,
    vpp: int,
    dp: int,
    world: int,
    seq: int,
    recompute: str,
    zero: int,
    off_opt: bool,
    off_par: bool,
    active: int,
    gpu_params: int,
    global_batch: int,
    wbytes: int,
    gbytes: int,
) -> CostCurve:
    tokens_per_gpu = global_batch * seq / world
    base = 6.0 * active * tokens_per_gpu / (cm.peak_flops * cm.mfu) * RECOMPUTE_FACTOR[recompute]
    zero3 = (
        2 * gpu_params * wbytes * (dp - 1) / dp / cm.dp_bandwidth if zero == 3 and dp > 1 else 0.0
    )
    per_shard = (gbytes + wbytes) / cm.pcie_bandwidth + 1.0 / cm.cpu_adam_rate if off_opt else 0.0
    per_m = 2 * gpu_params * wbytes / cm.pcie_bandwidth if off_par else 0.0
    return CostCurve(base, cm.small_batch_tokens / seq, (pp - 1) / vpp, zero3, per_shard, per_m)


def cost_at(c: CostCurve, b: int, m: int, shard: int) -> tuple[float, float, float]:
    """(compute, zero3, offload) seconds for micro-batch ``b`` and ``m`` micro-batches."""
    compute = c.base * (1.0 + c.small_batch / b) * (1.0 + c.bubble / m)
    return compute, c.zero3_per_m * m, c.offload_per_shard * shard + c.offload_per_m * m
