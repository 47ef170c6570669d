"""A layout's step-time fold: the device that sets the pace, each recompute level's seconds on it,
and the data-parallel amounts (``layout_cost``); what ``cost.py`` describes, per layout.

Why a module of its own, and why ``pace`` and ``level`` apart: the planner's lower bound
(``bound.py``) needs only the no-recompute level of every layout's fold, the planner the whole
fold of the few layouts it sweeps; both take the same ``pace`` and ``level``, so the bound and
the fold are one arithmetic, to the bit.
"""

from __future__ import annotations

from typing import NamedTuple

from dssup.memory.comm import Links, SeqComm, dp_bytes, layer_traffic, links, seq_comm
from dssup.memory.config import RECOMPUTE_LEVELS, Layout, Precision, Recompute
from dssup.memory.cost import (
    DEFAULT_RECOMPUTE,
    CostModel,
    LayoutCost,
    RcRaw,
    RecomputeSpec,
    bubble,
    tp_overlap,
    with_memory_bound,
)
from dssup.memory.flops import DeviceWork, device_work
from dssup.memory.spec import ModelSpec
from dssup.memory.topology import Topology

__all__ = ["Pace", "fold", "layout_cost", "level", "pace", "weight_reads"]


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
