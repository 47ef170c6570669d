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
layout (here), and everything but (b, m) into ``CostCurve`` once per (ZeRO, offload, recompute)
(``curve.py``), so the planner's inner loop stays a few float operations per config
(``curve.cost_at``). The constants and
their sources are in ``CostModel``; docs/step-time.md has the derivations and the validation.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dssup.memory.comm import Links, SeqComm, dp_bytes, layer_traffic, links, seq_comm
from dssup.memory.config import RECOMPUTE_LEVELS, Layout, Precision, Recompute
from dssup.memory.flops import DeviceWork, device_work
from dssup.memory.spec import ModelSpec
from dssup.memory.topology import Topology

__all__ = [
    "DEFAULT_RECOMPUTE",
    "TP_OVERLAP",
    "CostModel",
    "LayoutCost",
    "Pace",
    "RcPart",
    "RecomputeSpec",
    "bubble",
    "fold",
    "layout_cost",
    "level",
    "pace",
    "tp_overlap",
    "weight_reads",
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


class Pace(NamedTuple):
    """What every recompute level's fold reads of one layout: the device that sets the pace,
    its traffic, the links and the rates (``pace``)."""

    w: DeviceWork
    comm: SeqComm
    lk: Links
    fp8: bool
    gemm_rate: float
    core_rate: float
    moe: float  # MoE token handling seconds per sequence
    dual: bool  # DualPipe with PP > 1
    hide: tuple[float, float, float, float]  # hidden share of TP, EP, CP, PP traffic
    sm: float
    modules: frozenset[str]
    full: float  # share of the layers full recompute re-runs
    g0: float  # GEMM seconds per sequence without recompute
    c0: float  # attention-core seconds per sequence without recompute


def pace(
    cm: CostModel,
    topo: Topology,
    m: ModelSpec,
    layout: Layout,
    seq: int,
    precision: Precision,
    imbalance: float = 1.0,
    recompute: RecomputeSpec = DEFAULT_RECOMPUTE,
    framework: str = "megatron",
) -> Pace:
    """The slowest device of ``layout`` and what its fold reads. The slowest device sets the
    pace: the one with the most compute, MoE token handling and layer traffic (an even split
    that leaves the last stage one layer and the head can make the head's stage lighter than
    the others)."""
    works = device_work(m, layout, seq, imbalance)
    lk = links(topo, layout, cm.nvlink_efficiency, cm.nic_efficiency)
    fp8 = cm.compute_dtype == "fp8" and topo.fp8_flops is not None
    gemm_rate = topo.bf16_flops * cm.gemm_efficiency
    if fp8 and topo.fp8_flops is not None:
        gemm_rate = topo.fp8_flops * cm.fp8_gemm_efficiency
    core_rate = topo.bf16_flops * cm.attention_efficiency
    dedup = _dedup(m, lk) if cm.ep_dispatch == "dedup" else 1.0
    act = precision.activations if precision.activations < 4 else 2
    slot_s = m.hidden * cm.moe_slot_seconds
    rates = (gemm_rate, core_rate, slot_s)
    w, comm = _slowest(m, layout, works, seq, lk, (act, 1 if fp8 else act, dedup), rates)
    modules, method, n_layers = recompute
    chunks = layout.vpp if layout.schedule == "interleaved" else 1
    per_chunk = w.layers / chunks if w.layers else 1.0
    full = 1.0 if method == "uniform" else min(1.0, n_layers / per_chunk)
    g_none, c_none = w.fwd_bwd("none")
    dual = layout.schedule == "dualpipe" and layout.pp > 1
    hide = _hidden(cm, framework)
    return Pace(  # positional: a NamedTuple's keywords cost more than this whole fold
        w, comm, lk, fp8, gemm_rate, core_rate, w.slots * slot_s, dual, hide,
        cm.comm_sm_fraction, modules, full, g_none / gemm_rate, c_none / core_rate,
    )  # fmt: skip


def _hidden(cm: CostModel, framework: str) -> tuple[float, float, float, float]:
    """The hidden shares of TP, EP, CP and PP traffic: one tuple per cost model and framework
    (every layout's ``Pace`` holds it)."""
    key = (id(cm), framework)
    hit = _HIDDEN.get(key)
    if hit is None or hit[0] is not cm:
        if len(_HIDDEN) >= 64:
            _HIDDEN.clear()
        hide = (tp_overlap(cm, framework), 0.0, cm.cp_overlap, cm.pp_overlap)
        hit = _HIDDEN[key] = (cm, hide)  # the entry keeps ``cm`` alive: its id is not reused
    return hit[1]


_HIDDEN: dict[tuple[int, str], tuple[CostModel, tuple[float, float, float, float]]] = {}


def level(cm: CostModel, p: Pace, rc: Recompute) -> RcRaw:
    """One recompute level's seconds per sequence on the slowest device, before the
    memory-bound kernels join them."""
    g, c = p.w.fwd_bwd(rc, p.modules, p.full)
    gemm, core = g / p.gemm_rate, c / p.core_rate
    comm, sm = p.comm, p.sm
    traffic = (comm.tp[rc], comm.ep[rc], comm.cp[rc], comm.pp)
    shown = [(t, h) for t, h in zip(traffic, p.hide, strict=True)]
    overlapped = 0.0  # traffic that rides another micro-batch's compute
    if p.dual:  # DualPipe: EP and PP ride its overlapped forward/backward chunks
        shown[1], shown[3] = (0.0, 0.0), (0.0, 0.0)
        overlapped = traffic[1] + traffic[3]
    elif cm.ep_overlap:  # the all-to-all of one micro-batch behind another's compute
        shown[1] = (0.0, 0.0)
        overlapped = traffic[1]
    exposed = sum(t * (1 - h) + sm * t * h for t, h in shown)
    extra = max(0.0, gemm + core - p.g0 - p.c0)
    return RcRaw(gemm, core, exposed, overlapped, extra, traffic)


def weight_reads(p: Pace, params: int, precision: Precision, topo: Topology) -> float:
    """Seconds per micro-batch reading the device's ``params`` weights forward, for dgrad and
    for wgrad. A micro-batch crosses one of the two stages a DualPipe device holds: it reads
    half the device's weights (the work in ``device_work`` is the mean of the two stages
    likewise)."""
    read = params / 2 if p.dual else params
    return 3 * read * (1 if p.fp8 else precision.weights) / topo.hbm_bytes_per_s


def layout_cost(
    cm: CostModel,
    topo: Topology,
    m: ModelSpec,
    layout: Layout,
    seq: int,
    act_bytes_per_seq: int,
    dense_params: int,
    expert_params: int,
    precision: Precision,
    imbalance: float = 1.0,
    recompute: RecomputeSpec = DEFAULT_RECOMPUTE,
    framework: str = "megatron",
) -> LayoutCost:
    """Fold everything that depends only on the layout (``act_bytes_per_seq``: the stored
    activations of the largest device at b = 1, from the memory model) on the device that
    sets the pace (``pace``)."""
    p = pace(cm, topo, m, layout, seq, precision, imbalance, recompute, framework)
    return fold(cm, topo, layout, p, act_bytes_per_seq, dense_params, expert_params, precision)


def fold(
    cm: CostModel,
    topo: Topology,
    layout: Layout,
    p: Pace,
    act_bytes_per_seq: int,
    dense_params: int,
    expert_params: int,
    precision: Precision,
) -> LayoutCost:
    """``layout_cost`` from the layout's ``pace`` (the planner's lower bound has it already)."""
    raw = {rc: level(cm, p, rc) for rc in RECOMPUTE_LEVELS}
    gb, wb = precision.gradients, precision.weights
    zero_parts = {}
    lk = p.lk
    bw_d, bw_e = lk.dp.bytes_per_s, lk.edp.bytes_per_s
    for z in (0, 1, 2, 3):
        dense = dp_bytes(layout.dp * layout.cp, dense_params, z, gb, wb)
        expert = dp_bytes(layout.edp, expert_params, z, gb, wb)
        g, pr, gm, pm = (d / bw_d + e / bw_e for d, e in zip(dense, expert, strict=True))
        zero_parts[z] = (g, pr, gm, pm)
    params = dense_params + expert_params
    folded = LayoutCost(
        rc={},
        raw=raw,
        none=(p.g0, p.c0, p.moe),
        zero=zero_parts,
        weight_reads=weight_reads(p, params, precision, topo),
        bubble=bubble(layout),
        params=params,
        hbm=topo.hbm_bytes_per_s,
        host=topo.host_bytes_per_s,
        cores_per_gpu=topo.cores_per_gpu,
        lk=lk,
    )
    return with_memory_bound(folded, cm.elementwise_passes * act_bytes_per_seq / folded.hbm)


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


def _slowest(
    m: ModelSpec,
    layout: Layout,
    works: tuple[DeviceWork, ...],
    seq: int,
    lk: Links,
    sizes: tuple[int, int, float],
    rates: tuple[float, float, float],
) -> tuple[DeviceWork, SeqComm]:
    """The device that sets the pace, by compute, MoE token handling and layer traffic, and
    its traffic (devices of the same make-up share the traffic computation)."""
    seen: dict[tuple[float, float, float], float] = {}  # a make-up's TP + EP seconds
    best: tuple[float, DeviceWork] | None = None
    for x, compute in _compute_paces(works, rates):
        key = (x.layers, x.moe_layers, x.slots)
        comm = seen.get(key)
        if comm is None:
            tp_fwd, ep_fwd = layer_traffic(m, layout, x, seq, lk, sizes)
            comm = seen[key] = 2 * tp_fwd + 2 * ep_fwd  # SeqComm's tp + ep, no recompute
        pace = compute + comm
        if best is None or pace > best[0]:
            best = (pace, x)
    assert best is not None  # a layout has at least one device
    return best[1], seq_comm(m, layout, best[1], seq, lk, sizes)


def _compute_paces(
    works: tuple[DeviceWork, ...], rates: tuple[float, float, float]
) -> tuple[tuple[DeviceWork, float], ...]:
    """Each distinct device work object of ``works`` (stages of one make-up are one object,
    ``flops.device_work``: a repeat has the same pace, never a later maximum) with its compute
    and MoE seconds per sequence at ``rates``; cached per works tuple, which layouts of other
    EP and DP share."""
    key = (id(works), rates)
    hit = _PACES.get(key)
    if hit is not None and hit[0] is works:
        return hit[1]
    gemm_rate, core_rate, slot_s = rates
    done: set[int] = set()
    out = []
    for x in works:
        if id(x) not in done:
            done.add(id(x))
            out.append((x, x.gemm / gemm_rate + x.core / core_rate + x.slots * slot_s))
    if len(_PACES) >= 1024:
        _PACES.clear()
    _PACES[key] = (works, tuple(out))  # the entry keeps ``works`` alive: its id is not reused
    return _PACES[key][1]


_PACES: dict[
    tuple[int, tuple[float, float, float]],
    tuple[tuple[DeviceWork, ...], tuple[tuple[DeviceWork, float], ...]],
] = {}


def _dedup(m: ModelSpec, lk: Links) -> float:
    """Cross-node copies per token with one copy per node, relative to one per expert: with
    ``k`` experts spread uniformly over ``N`` nodes a token reaches ``(N-1)(1-(1-1/N)^k)``
    other nodes on average instead of sending ``k(1-1/N)`` copies."""
    if m.moe is None or lk.ep.intra:
        return 1.0
    n, k = lk.ep.nodes, m.moe.top_k
    return (n - 1) * (1 - (1 - 1 / n) ** k) / (k * (1 - 1 / n))


def bubble(layout: Layout) -> float:
    """Pipeline fill and drain, in micro-batches of work on the slowest device."""
    pp = layout.pp
    if pp == 1:
        return 0.0
    if layout.schedule == "dualpipe":
        return (pp / 2 - 1) * 2 / 3
    vpp = layout.vpp if layout.schedule == "interleaved" else 1
    return (pp - 1) / vpp
