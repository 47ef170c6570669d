"""The step-time model that ranks the configs that fit: seconds per optimizer step, by term.

Why a physical model: the planner's top row becomes the webhook's resize and the supervisor's
remedy, so the ranking must be one an engineer would pick: TP kept on NVLink, expert
all-to-all priced on the link it crosses, ZeRO stages apart by what they communicate, CPU
offload as slow as the host cores behind it. Every term is shown (``dssup plan --explain N``).

For one config (micro-batch ``b``, ``m`` micro-batches, ZeRO stage, offload, recompute)::

    C    = b * compute_per_sequence[rc] + weight_reads          # one micro-batch, one device
    X    = exposed TP/EP/CP/PP communication of that micro-batch  (+ SM cost of the hidden part)
    Z    = ZeRO-2/3 and parameter-offload traffic per micro-batch, hidden behind C up to dp_overlap
    T_mb = C + X + Z_exposed
    step = (m + bubble) * T_mb + exposed gradient/parameter sync + optimizer step (GPU or CPU)

``bubble`` is ``(PP-1)/VPP`` micro-batches for 1F1B and interleaved 1F1B and
``(PP/2-1)(F&B + B - 3W)/(F+B)`` for DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437,
Table 2; with F:B:W = 1:2:1 that is ``(PP/2-1) * 2/3``); DualPipe also hides EP and PP traffic
behind the overlapped forward/backward chunk, up to its compute time (same report, sec. 3.2.1),
with 20 of the 132 SMs kept for the communication kernels throughout (sec. 3.2.2), so its
compute runs ``comm_sm_fraction`` slower whenever there is traffic to hide.

Everything that does not depend on (b, m, ZeRO, offload) is folded into ``LayoutCost`` once per
layout (``fold.py``: the device that sets the pace, each recompute level on it), and everything
but (b, m) into ``CostCurve`` once per (ZeRO, offload, recompute) (``curve.py``), so the
planner's inner loop stays a few float operations per config (``curve.cost_at``). The constants and
their sources are in ``CostModel``; docs/step-time.md has the derivations and the validation.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dssup.memory.comm import Links
from dssup.memory.config import Layout, Recompute

__all__ = [
    "DEFAULT_RECOMPUTE",
    "TP_OVERLAP",
    "CostModel",
    "LayoutCost",
    "RcPart",
    "RcRaw",
    "RecomputeSpec",
    "bubble",
    "tp_overlap",
    "with_memory_bound",
]


class CostModel(BaseModel):
    """Constants of the step-time model, and how the job runs. Sources in docs/step-time.md."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    compute_dtype: Literal["bf16", "fp8"] = Field(
        "bf16",
        description="GEMM precision (fp8: TransformerEngine/DeepSeek FP8 GEMMs; the "
        "attention core stays BF16)",
    )
    gemm_efficiency: float = Field(
        0.68,
        gt=0,
        le=1,
        description="fraction of the dense BF16 peak that training GEMMs reach (FITTED: "
        "bench/fit_step_time.py on the recipes marked fit; others held out)",
    )
    fp8_gemm_efficiency: float = Field(
        0.48,
        gt=0,
        le=1,
        description="fraction of the dense FP8 peak that FP8 GEMMs reach, "
        "quantisation and scaling included (FITTED like gemm_efficiency)",
    )
    attention_efficiency: float = Field(
        0.45, gt=0, le=1, description="fraction of the BF16 peak fused attention reaches"
    )
    elementwise_passes: float = Field(
        4.0,
        ge=0,
        description="passes over the stored activations by memory-bound kernels "
        "(written forward, read backward, gradient written and read)",
    )
    nvlink_efficiency: float = Field(
        0.8,
        gt=0,
        le=1,
        description="achieved fraction of the per-direction NVLink figure "
        "(DeepSeek-V3 report sec. 3.2.2 gives NVLink 160 GB/s on its H800 nodes; the GPU "
        "table has 200 GB/s per direction)",
    )
    nic_efficiency: float = Field(
        0.92,
        gt=0,
        le=1,
        description="achieved fraction of the NIC line rate: 46 of 50 GB/s per 400 Gb/s NIC, "
        "below the 'up to 48-49 GB/s' NVIDIA gives for a CX-7 NIC at 400 Gb/s "
        "(NVIDIA/nccl-tests#267) and 24 GB/s per 200 Gb/s NIC (NVIDIA/nccl-tests#119)",
    )
    comm_sm_fraction: float = Field(
        20 / 132,
        ge=0,
        le=1,
        description="compute slowdown while communication is hidden "
        "behind it (DeepSeek-V3 report sec. 3.2.2: 20 of 132 SMs run communication)",
    )
    tp_overlap: float | None = Field(
        None,
        ge=0,
        le=1,
        description="fraction of TP traffic hidden behind GEMMs; None: the framework's "
        "(``TP_OVERLAP``: Megatron 0.5, every other framework 0)",
    )
    ep_overlap: bool = Field(
        False,
        description="the expert all-to-all of one micro-batch runs behind another's compute "
        "(Megatron --overlap-moe-expert-parallel-comm / moe_a2a_overlap, DeepEP/HybridEP "
        "overlap; always under DualPipe): hidden up to the compute, the rest exposed",
    )
    cp_overlap: float = Field(0.8, ge=0, le=1, description="CP ring traffic hidden")
    pp_overlap: float = Field(0.5, ge=0, le=1, description="PP sends hidden")
    dp_overlap: float = Field(
        1.0,
        ge=0,
        le=1,
        description="fraction of a micro-batch's compute that data-parallel "
        "traffic (gradient reduce, ZeRO gathers) can hide behind",
    )
    ep_dispatch: Literal["alltoall", "dedup"] = Field(
        "alltoall",
        description="alltoall: one copy per (token, expert); dedup: one copy per "
        "(token, node) across nodes (DeepEP, HybridEP)",
    )
    moe_slot_seconds: float = Field(
        8.3e-11,
        ge=0,
        description="seconds per routed (token, expert) slot and hidden element, forward and "
        "backward, that fine-grained MoE layers cost beyond their GEMMs and all-to-all "
        "(permutation, routing, narrow grouped GEMMs; FITTED: bench/fit_step_time.py on the "
        "MoE recipes marked fit)",
    )
    cpu_adam_params_per_core: float = Field(
        12e6,
        gt=0,
        description="parameters per second one host core updates with DeepSpeed's "
        "CPU Adam (DeepSpeed blog zenflow-corebinding: 0.77 B parameters in ~1.0 s on 64 cores)",
    )


#: TP traffic hidden behind GEMMs when ``CostModel.tp_overlap`` is None, by framework. Megatron-Core
#: with TransformerEngine overlaps the TP collectives with GEMMs (``tp_comm_overlap``, which
#: Megatron-Bridge's performance recipes turn on whenever TP > 1); how much it hides is an
#: assumption (half). No other framework publishes such an overlap (DeepSeek's avoids TP,
#: DeepSeek-V3 report sec. 3.2; DualPipe hides EP and PP traffic, not TP), so there it is 0:
#: assuming an overlap nobody documents would be the optimistic default.
TP_OVERLAP: dict[str, float] = {"megatron": 0.5}


def tp_overlap(cm: CostModel, framework: str) -> float:
    """The fraction of TP traffic hidden: the model's setting, else the framework's."""
    return cm.tp_overlap if cm.tp_overlap is not None else TP_OVERLAP.get(framework, 0.0)


class RecomputeSpec(NamedTuple):
    """What the recompute levels re-run: Megatron's selective modules, and for full recompute
    the method (uniform: every layer; block: the first ``num_layers`` of each stage)."""

    modules: frozenset[str]
    method: str
    num_layers: int


DEFAULT_RECOMPUTE = RecomputeSpec(frozenset({"core_attn"}), "uniform", 1)


class RcPart(NamedTuple):
    """What one recompute level costs per sequence on the slowest device (seconds)."""

    seq: float  # compute: GEMMs, attention core, memory-bound kernels, recompute
    exposed: float  # exposed TP/EP/CP/PP traffic plus the SM cost of the hidden part
    dual: float  # EP (+ PP under DualPipe) traffic hidden behind compute up to its length
    fwd_share: float  # forward part of the compute (what parameter gathers can hide behind)
    parts: tuple[float, float, float, float, float]  # GEMM, attention, memory-bound, MoE, rc
    traffic: tuple[float, float, float, float]  # raw TP, EP, CP, PP seconds


class RcRaw(NamedTuple):
    """A recompute level's seconds per sequence before the memory-bound kernels join them."""

    gemm: float
    core: float
    exposed: float
    dual: float
    extra: float
    traffic: tuple[float, float, float, float]


class LayoutCost(NamedTuple):
    """Everything that depends only on the layout, folded once (most configs never need it:
    the planner folds it on the first config of the layout that fits)."""

    rc: dict[Recompute, RcPart]
    raw: dict[Recompute, RcRaw]  # what ``with_memory_bound`` finishes ``rc`` from
    none: tuple[float, float, float]  # GEMM and attention seconds without recompute, MoE
    zero: dict[int, tuple[float, float, float, float]]  # seconds: dp_bytes' four amounts
    weight_reads: float  # seconds per micro-batch: weights read forward, dgrad, wgrad
    bubble: float  # micro-batches
    params: int  # parameters on the device (DualPipe: both stages)
    hbm: float
    host: float
    cores_per_gpu: float | None
    lk: Links


def with_memory_bound(lc: LayoutCost, elem: float) -> LayoutCost:
    """``lc`` with ``elem`` seconds of memory-bound kernels per sequence (the activations the
    memory model stores, ``elementwise_passes`` times over HBM): ``layout_cost``'s last step,
    so a fold made without the activations (the planner's lower bound) is finished later with
    exactly the arithmetic a direct fold has."""
    g0, c0, moe = lc.none
    rc_parts: dict[Recompute, RcPart] = {}
    for rc, x in lc.raw.items():
        total = x.gemm + x.core + elem + moe
        rc_parts[rc] = RcPart(
            seq=total,
            exposed=x.exposed,
            dual=x.dual,
            fwd_share=(g0 + c0) / 3 / total if total else 0.0,
            parts=(g0, c0, elem, moe, x.extra),
            traffic=x.traffic,
        )
    return lc._replace(rc=rc_parts)


def bubble(layout: Layout) -> float:
    """Pipeline fill and drain, in micro-batches of work on the slowest device."""
    pp = layout.pp
    if pp == 1:
        return 0.0
    if layout.schedule == "dualpipe":
        return (pp / 2 - 1) * 2 / 3
    vpp = layout.vpp if layout.schedule == "interleaved" else 1
    return (pp - 1) / vpp
