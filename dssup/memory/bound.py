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
from typing import Generic, TypeVar

from dssup.memory.config import Convention, Layout
from dssup.memory.cost import CostModel, LayoutCost, layout_cost
from dssup.memory.curve import cost_at, make_curve
from dssup.memory.defaults import Resolved
from dssup.memory.memo import ModelMemo
from dssup.memory.params import Split
from dssup.memory.spec import ModelSpec
from dssup.memory.stages import partition, placement, stage_params
from dssup.memory.steptime import recompute_spec
from dssup.memory.topology import Topology

__all__ = ["Kept", "bound_fold", "device_params", "lower_bound"]

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
    tied and both ends are on it), as ``core.prepare`` adds them up."""
    pad = r.framework in ("megatron", "deepseek")
    key = (
        layout.tp,
        layout.ep,
        layout.etp,
        layout.pp,
        layout.vpp,
        layout.schedule,
        layout.layers_per_stage,
        conv,
        r.mtp,
        pad,
    )
    return _PARAMS.get(m, key, lambda: _device_params(m, layout, conv, r.mtp, pad))


_PARAMS = ModelMemo(8192)


def _device_params(m: ModelSpec, layout: Layout, conv: Convention, mtp: bool, pad: bool) -> Split:
    stages = [
        stage_params(m, layout, conv, layers, i, mtp, pad)
        for i, layers in enumerate(partition(m.layers, layout))
    ]
    best = Split()
    for held in placement(layout):
        split = Split()
        for j in held:
            split += stages[j].split
        own = [stages[j] for j in held]
        if len(own) > 1 and m.tie_embeddings and own[0].first and own[-1].last:
            split += Split(non_moe=-own[0].embedding)
        if split.total > best.total:
            best = split
    return best


def bound_fold(
    cm: CostModel,
    topo: Topology,
    m: ModelSpec,
    layout: Layout,
    seq: int,
    conv: Convention,
    r: Resolved,
    imbalance: float,
) -> LayoutCost:
    """The layout's step-time fold without its memory-bound kernel time (which needs the
    memory model's activations): every config's time with it is at most its true time.
    Memoised per model object, cost model and topology object (a long-lived planner re-plans
    the same layouts: the webhook, the supervisor)."""
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

    def fold() -> tuple[CostModel, Topology, LayoutCost]:
        params = device_params(m, layout, conv, r)
        spec = recompute_spec(r)
        return (
            cm,
            topo,
            layout_cost(
                cm,
                topo,
                m,
                layout,
                seq,
                0,  # no memory-bound kernel time
                params.non_moe,
                params.moe,
                r.precision,
                imbalance,
                spec,
                r.framework,
            ),
        )

    return _FOLDS.get(m, key, fold)[2]  # the entry keeps cm and topo alive: ids not reused


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


def lower_bound(lc: LayoutCost, cm: CostModel, micro: list[int], rows: int) -> float:
    """Seconds per step no config of the layout ``lc`` (``bound_fold``) folds can beat."""
    # no ZeRO-3 gathers, parameter offload, gradient reduce, weight all-gather or optimizer step
    curve = make_curve(cm, lc, "none", 0.0, 0.0, 0.0, 0.0, 0.0)
    return min(cost_at(curve, b, rows // b) for b in micro)
