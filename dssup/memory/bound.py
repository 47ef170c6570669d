"""A lower bound on the step time of every config of a layout, and the best configs kept so far:
what lets ``plan`` rank the first rows without sweeping every layout's memory.

Why: the default search for DeepSeek-V3 on 2048 GPUs has about 1,400 layouts (TP, PP, EP,
schedule, VPP, layer split, framework), and almost every one has configs that fit (ZeRO-3
shards anything), so sweeping all of them costs more than a second in CPython. A user reads
the first rows. For each layout the step-time model gives, without touching the memory model,
a time no config of that layout can beat: the slowest device's compute and exposed TP/EP/CP/PP
traffic of one sequence without recompute, the pipeline bubble, the weight reads, at the best
micro-batch, with every data-parallel, ZeRO and optimizer term left out and no memory-bound
kernel time. Every one of those left-out terms is a cost of its own (``curve.cost_at`` adds
them), recompute only adds compute and traffic (and traffic it lets hide is at most the compute
it adds), so the bound is below every config's time (a property test checks it on the planner's
own rows). Layouts are swept in the order of their bound, and once ``limit`` configs are kept, a
layout whose bound is not below the slowest kept one cannot enter the table and is skipped.
The first ``limit`` rows are the ones an exhaustive sweep ranks first; the counts cover the
layouts swept, and the result says how many were not.
"""

from __future__ import annotations

import heapq
from typing import Generic, NamedTuple, TypeVar

from dssup.memory.config import Convention, Layout
from dssup.memory.cost import CostModel, LayoutCost, bubble
from dssup.memory.defaults import Resolved
from dssup.memory.fold import Pace, fold, level, pace, weight_reads
from dssup.memory.memo import ModelMemo
from dssup.memory.params import Split
from dssup.memory.spec import ModelSpec
from dssup.memory.stages import (
    StageKind,
    StageParams,
    kind_params,
    moe_layers_in,
    partition,
    placement,
)
from dssup.memory.steptime import recompute_spec
from dssup.memory.topology import Topology

__all__ = [
    "FoldArgs",
    "Kept",
    "LayoutBound",
    "bound_fold",
    "device_params",
    "fold_params",
    "layout_bound",
    "lower_bound",
]

T = TypeVar("T")


class Kept(Generic[T]):
    """The ``limit`` fastest configs seen so far (a max-heap on step time), shared by the
    searches of every framework; ties keep the earlier one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.heap: list[tuple[float, int, T]] = []  # (-seconds, -order, item)
        self.order = 0

    def offer(self, seconds: float, item: T) -> None:
        self.order += 1
        if len(self.heap) < self.limit:
            heapq.heappush(self.heap, (-seconds, -self.order, item))
        elif seconds < -self.heap[0][0]:
            heapq.heapreplace(self.heap, (-seconds, -self.order, item))

    @property
    def threshold(self) -> float:
        """The slowest kept time once ``limit`` are kept (infinity before): a layout whose
        bound is not below it cannot enter."""
        return -self.heap[0][0] if len(self.heap) >= self.limit else float("inf")

    def ranked(self) -> list[tuple[float, int, T]]:
        """Fastest first, ties in the order they were offered."""
        return sorted((-s, -q, item) for s, q, item in self.heap)


def device_params(m: ModelSpec, layout: Layout, conv: Convention, r: Resolved) -> Split:
    """Parameters of the device holding the most (all its stages; one embedding matrix when
    tied and both ends are on it), as ``core.prepare`` adds them up (a layout's bound keeps
    them: ``fold_params``)."""
    return _device_params(m, layout, conv, r.mtp, r.framework in ("megatron", "deepseek"))


def _device_params(m: ModelSpec, layout: Layout, conv: Convention, mtp: bool, pad: bool) -> Split:
    """A stage's parameters are linear in what it holds (``stages.kind_params``: its MoE and
    dense layers, and the embedding or head of an edge stage), so a device's are its layer
    counts times one layer's plus its edge stages': integers, the same sum ``prepare`` makes
    stage by stage."""
    (moe_nm, moe_m), (dense_nm, dense_m), edge, tied = _units(m, layout, conv, mtp, pad)
    best_nm = best_m = 0
    best = -1
    for moe, dense, edges, both_ends in _holdings(m, layout):
        nm = moe * moe_nm + dense * dense_nm
        em = moe * moe_m + dense * dense_m
        for e in edges:
            nm += edge[e][0]
            em += edge[e][1]
        if both_ends:  # one matrix serves both ends when tied
            nm -= tied
        if nm + em > best:
            best, best_nm, best_m = nm + em, nm, em
    return Split(best_nm, best_m)


_Units = tuple[tuple[int, int], tuple[int, int], dict[tuple[bool, bool], tuple[int, int]], int]


def _units(m: ModelSpec, layout: Layout, conv: Convention, mtp: bool, pad: bool) -> _Units:
    """(non-MoE, MoE) parameters of one MoE layer, one dense layer and each kind of edge
    stage on one GPU, and the embedding a device holding both tied ends counts once."""
    tp, ep, etp = layout.tp, layout.ep, layout.etp

    def make() -> _Units:
        def unit(moe: int, dense: int, first: bool = False, last: bool = False) -> StageParams:
            return kind_params(m, StageKind(tp, ep, etp, conv, moe, dense, first, last, mtp, pad))

        def pair(sp: StageParams) -> tuple[int, int]:
            return sp.split.non_moe, sp.split.moe

        moe = pair(unit(1, 0)) if m.moe is not None else (0, 0)
        edges = ((True, False), (False, True), (True, True))
        tied = unit(0, 0).embedding if m.tie_embeddings else 0
        return moe, pair(unit(0, 1)), {e: pair(unit(0, 0, *e)) for e in edges}, tied

    return _UNITS.get(m, (tp, ep, etp, conv, mtp, pad), make)


_UNITS = ModelMemo(1024)


_Holding = tuple[int, int, tuple[tuple[bool, bool], ...], bool]


def _holdings(m: ModelSpec, layout: Layout) -> tuple[_Holding, ...]:
    """What each device holds, in device order, each make-up once (an equal one cannot hold
    more): MoE layers, dense layers, its edge stages as (first, last), and whether it holds the
    first stage first and the last one last (two stages: ``prepare``'s tied embedding)."""
    key = (layout.pp, layout.vpp, layout.schedule, layout.layers_per_stage)
    return _HOLD.get(m, key, lambda: _holdings_of(m, layout))


_HOLD = ModelMemo(1024)


def _holdings_of(m: ModelSpec, layout: Layout) -> tuple[_Holding, ...]:
    parts = partition(m.layers, layout)
    last = len(parts) - 1
    out: dict[_Holding, None] = {}
    for held in placement(layout):
        moe = sum(moe_layers_in(m, parts[j]) for j in held)
        dense = sum(len(parts[j]) for j in held) - moe
        edges = tuple((j == 0, j == last) for j in held if j in (0, last))
        both = len(held) > 1 and held[0] == 0 and held[-1] == last
        out.setdefault((moe, dense, edges, both), None)
    return tuple(out)


class LayoutBound(NamedTuple):
    """What the lower bound reads of a layout's fold: seconds per sequence (b = 1) of the
    slowest device without recompute or memory-bound kernels, its exposed and overlapped
    traffic, the weight reads per micro-batch, the bubble in micro-batches, and the SM share
    hidden traffic costs (``cost_at`` of a curve with no data-parallel or optimizer terms)."""

    seq: float
    exposed: float
    dual: float
    weight_reads: float
    bubble: float
    sm: float


class _Entry:
    """A layout's memoised pace, bound and (once swept) fold; it keeps ``cm`` and ``topo``
    alive, so their ids in the key are not reused."""

    __slots__ = ("bound", "cm", "fold", "pace", "params", "topo")

    def __init__(
        self, cm: CostModel, topo: Topology, pace: Pace, params: Split, bound: LayoutBound
    ) -> None:
        self.cm, self.topo, self.pace, self.params, self.bound = cm, topo, pace, params, bound
        self.fold: LayoutCost | None = None


class FoldArgs(NamedTuple):
    """What a layout's fold is made of: the cost model, GPU, model, layout, sequence length,
    convention, resolved settings and MoE imbalance."""

    cm: CostModel
    topo: Topology
    m: ModelSpec
    layout: Layout
    seq: int
    conv: Convention
    r: Resolved
    imbalance: float


def layout_bound(a: FoldArgs) -> LayoutBound:
    """The layout's ``LayoutBound``: only the no-recompute level of its fold, with no
    memory-bound kernel time (which needs the memory model's activations) and no
    data-parallel or optimizer terms, so every config's time is at least what
    ``lower_bound`` makes of it. Memoised per model object, cost model and topology object (a
    long-lived planner re-plans the same layouts: the webhook, the supervisor)."""
    return _entry(a).bound


def bound_fold(a: FoldArgs) -> LayoutCost:
    """The layout's whole step-time fold without its memory-bound kernel time, from the pace
    its bound found (folded once, for the layouts the bound lets through)."""
    e = _entry(a)
    if e.fold is None:
        p = e.params
        e.fold = fold(a.cm, a.topo, a.layout, e.pace, 0, p.non_moe, p.moe, a.r.precision)
    return e.fold


def fold_params(a: FoldArgs) -> Split:
    """``device_params`` of the layout, as its bound found them."""
    return _entry(a).params


def _entry(a: FoldArgs) -> _Entry:
    cm, topo, m, layout, seq, conv, r, imbalance = a
    key = (
        id(cm),
        id(topo),
        layout.tp,
        layout.sp,
        layout.pp,
        layout.vpp,
        layout.ep,
        layout.etp,
        layout.cp,
        layout.dp,
        layout.schedule,
        layout.layers_per_stage,
        seq,
        conv,
        resolved_key(r),
        imbalance,
    )

    def make() -> _Entry:
        params = device_params(m, layout, conv, r)
        spec = recompute_spec(r)
        p = pace(cm, topo, m, layout, seq, r.precision, imbalance, spec, r.framework)
        x = level(cm, p, "none")
        reads = weight_reads(p, params.total, r.precision, topo)
        # ``with_memory_bound`` with no memory-bound time: gemm + core (+ 0.0) + MoE
        lb = LayoutBound(x.gemm + x.core + p.moe, x.exposed, x.dual, reads, bubble(layout), p.sm)
        return _Entry(cm, topo, p, params, lb)

    return _FOLDS.get(m, key, make)


def resolved_key(r: Resolved) -> tuple[object, ...]:
    """What of the resolved settings a fold reads, as a cheap key (computed once per object)."""
    found = _RKEYS.get(id(r))
    if found is None or found[0] is not r:
        if len(_RKEYS) > 256:
            _RKEYS.clear()
        p = r.precision
        key = (
            r.framework,
            r.mtp,
            r.recompute_modules,
            r.recompute_method,
            r.recompute_num_layers,
            (p.weights, p.gradients, p.master, p.moments, p.activations, p.cache_fp8),
        )
        found = _RKEYS[id(r)] = (r, key)
    return found[1]


_RKEYS: dict[int, tuple[Resolved, tuple[object, ...]]] = {}


_FOLDS = ModelMemo(4096)


def lower_bound(lb: LayoutBound, micro: list[int], rows: int) -> float:
    """Seconds per step no config of the layout can beat: ``curve.cost_at`` of its
    no-recompute curve with no ZeRO-3 gathers, parameter offload, gradient reduce, weight
    all-gather or optimizer step (those terms are zero, so only the micro-batches' compute,
    exposed traffic and the bubble remain), at the best micro-batch."""
    seq, exposed, dual, reads, bub, sm = lb
    best = float("inf")
    for b in micro:
        comp = b * seq + reads
        x = b * exposed
        if dual:  # the overlap keeps its communication SMs for the whole overlapped chunk
            d = b * dual
            x += d - comp + sm * comp if d > comp else sm * comp
        step = (rows // b + bub) * (comp + x)
        best = min(best, step)
    return best
