"""One framework's sweep of the planner's search space: integer arithmetic identical to
``estimate``'s, step times from curves folded once per (layout, ZeRO, offload, recompute).

Why: the search is activations linear in the micro-batch, so each layout's devices are prepared
once (``core.prepare``), grouped into kinds that peak alike, and every (ZeRO, offload,
recompute, micro-batch) config is a few integer operations on them (``sweep.py``); each layout's
splits are gathered and every config keeps its best (``flush``); the kept rows are shared by
every framework's search (``bound.Kept``). ``plan.py`` decides the order and what to skip.
"""

from __future__ import annotations

import math

from dssup.errors import ConfigError
from dssup.memory.bound import (
    FoldArgs,
    Kept,
    bound_fold,
    fold_params,
    layout_bound,
    lower_bound,
)
from dssup.memory.capacity import band, budget
from dssup.memory.config import (
    RECOMPUTE_LEVELS,
    Layout,
    Overheads,
    Recompute,
    Training,
)
from dssup.memory.core import PreparedDevice, States, in_flight_levels, prepare, states, tails
from dssup.memory.cost import LayoutCost, with_memory_bound
from dssup.memory.curve import CostCurve, cost_at, cost_curve, cost_terms, traffic
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.offload import host_states, with_overhead
from dssup.memory.params import Split
from dssup.memory.plan_types import Candidate, PlanRequest
from dssup.memory.schedule import accumulation_rule
from dssup.memory.steptime import fold_layout, recompute_spec, stored_per_sequence
from dssup.memory.sweep import InFlight, Row, fit_prefix, peak
from dssup.memory.topology import Topology
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_device import traced_device, traced_in_flight
from dssup.memory.traced_stage import TracedStage
from dssup.memory.validate import divisors, validate
from dssup.memory.zero import model_states

__all__ = ["KeptRow", "Search", "hit_bytes"]


def _groups(
    devices: list[PreparedDevice],
    layout: Layout,
    dual: dict[int, dict[Recompute, int]] | None = None,
) -> list[PreparedDevice]:
    """One device per kind. 1F1B: devices with equal parameters and activations peak at the
    lowest index (it holds the most in-flight micro-batches); DualPipe: devices with equal
    parameters, in-flight bytes (stage j keeps PP - j micro-batches, so two middle stages of
    the same size add up alike on every rank), working sets and edge stages are one kind;
    interleaved: every rank differs. ``dual`` receives each DualPipe device's in-flight bytes
    per recompute level (by ``id``), which its rows reuse."""
    if layout.schedule == "interleaved" and layout.pp > 1:
        return devices
    seen: dict[tuple[object, ...], PreparedDevice] = {}
    for dev in devices:
        if layout.schedule == "dualpipe":
            key: tuple[object, ...] = _dual_kind(dev, layout, dual)
        else:
            st = dev.stages[0]
            key = (dev.split, tuple(sorted(st.acts.items())), dev.largest_layer)
            key += (tuple(sorted(st.work.items())), st.params.embedding * st.params.first)
        seen.setdefault(key, dev)
    return list(seen.values())


def _dual_kind(
    dev: PreparedDevice, layout: Layout, dual: dict[int, dict[Recompute, int]] | None
) -> tuple[object, ...]:
    """What a DualPipe device's rows read: parameters, in-flight bytes per recompute level,
    working sets, constants and which edge stages it holds (eager moments: every rank)."""
    if any(st.moments for st in dev.stages):
        return (dev.index,)
    by_rc = in_flight_levels(dev, layout, 2 * layout.pp)
    if dual is not None:
        dual[id(dev)] = by_rc
    acts = tuple(by_rc.values())
    edges = tuple(sorted((st.params.first, st.params.last) for st in dev.stages))
    return (
        dev.split,
        dev.largest_layer,
        acts,
        tuple(sorted(dev.works.items())),
        tuple(sorted(dev.consts.items())),
        edges,
    )


def _valid_accumulation(layout: Layout, m: int) -> bool:
    return accumulation_rule(layout, m) == 0


_Choice = tuple[int, bool, bool]  # ZeRO stage, optimizer offload, parameter offload
_OFFLOAD = {"none": (False, False), "optimizer": (True, False), "both": (True, True)}
_Key = tuple[int, int, bool, bool, Recompute]
# a fitting config: step time, layout, (ZeRO, b, offload opt/params, recompute), the device
# rows, accumulation, its cost curve, host bytes per node, near the limit, and (total, peak
# stage, phase) where already known (else recomputed from the rows for the chosen few)
_Exact = tuple[int, int, str]
_Hit = tuple[float, Layout, _Key, list[Row], int, CostCurve, int, bool, _Exact | None]

KeptRow = tuple[_Hit, "Search"]  # a kept config and the search that can describe it
_NO_TAILS: dict[Recompute, tuple[tuple[int, int], ...]] = dict.fromkeys(RECOMPUTE_LEVELS, ())


class _Lazy:
    """A layout's ``LayoutCost``, folded only if one of its configs fits (most do not)."""

    __slots__ = ("bound", "curves", "groups", "value")

    def __init__(self, groups: list[PreparedDevice], bound: LayoutCost | None = None) -> None:
        self.groups = groups
        self.bound = bound  # the lower bound's fold, when the search is bounded
        self.value: LayoutCost | None = None
        self.curves: dict[tuple[Recompute, int, bool, bool, int], CostCurve] = {}


class Search:
    """The inner loop: integer arithmetic only, identical to ``estimate``'s; the step time is
    ``cost_at`` on a curve folded once per (layout, ZeRO, offload, recompute)."""

    def __init__(
        self, req: PlanRequest, topo: Topology, allow_offload: bool, kept: Kept[KeptRow]
    ) -> None:
        self.req = req
        self.topo = topo
        self.allow_offload = allow_offload
        self.ov = req.overheads or Overheads()
        self.r: Resolved = resolve(req.convention, req.training, self.ov)
        # Eager frameworks checkpoint whole layers only: no selective level to search.
        eager = req.convention == "megatron" and self.r.framework in ("transformers", "deepspeed")
        self.levels = tuple(rc for rc in req.recompute if not (eager and rc == "selective"))
        self.levels = _traced_levels(req, self.levels)
        self.budget = budget(req.gpu_memory_bytes, req.margin)
        traced = isinstance(req.training.implementation, TracedProfile)
        self.band = band(self.r.framework, traced)
        # a fitting config above this many bytes is within the model's uncertainty of the GPU
        self.near = int(req.gpu_memory_bytes * (1.0 - self.band.fraction))
        self.frag = self.r.fragmentation
        self.extra = self.r.cuda_context_bytes + self.ov.calibration_bytes
        kinds = req.offloads or (("none", "optimizer", "both") if allow_offload else ("none",))
        if not allow_offload:
            kinds = tuple(k for k in kinds if k == "none")
        self.offloads = [_OFFLOAD[k] for k in kinds]
        self._knob_cache: dict[tuple[int, bool, bool, int | None], Training] = {}
        self.layouts = 0  # layouts whose configs were evaluated
        # in-flight bytes per device of the current layout (they do not depend on ZeRO/offload)
        self._dual: dict[int, dict[Recompute, int]] = {}
        self._tables: dict[int, InFlight] = {}
        self.skipped: list[Layout] = []  # layouts no micro-batch choice could run
        self.evaluated = 0
        self.fitting: list[_Hit] = []  # the current base layout's (all its splits)
        self.kept = kept  # the best ``limit`` configs of every framework's search
        self.count = 0  # fitting configs, each once with its best split
        self.near_count = 0
        self.closest: _Hit | None = None
        self.host_budget = req.host_memory_bytes or (1 << 62)
        self.host_limited = 0
        self.host_limited_bytes: int | None = None
        self._limited: set[_Key] = set()  # the current base's configs the host cannot hold
        self._micro: dict[tuple[object, ...], list[int]] = {}  # runnable micro-batches
        self._host = (0, 0)  # host bytes per node of the current (ZeRO, offload): m = 1, m > 1

    def _layout_cost(
        self, layout: Layout, groups: list[PreparedDevice], lb: LayoutCost | None
    ) -> LayoutCost:
        """Step-time figures of ``layout`` (the same folding ``step_time`` uses; from the lower
        bound's fold ``lb`` when there is one, finished with the stored activations)."""
        req = self.req
        if lb is not None:
            acts = stored_per_sequence(layout, groups)
            return with_memory_bound(lb, req.cost.elementwise_passes * acts / lb.hbm)
        seq = req.training.seq_len
        imb = req.training.moe_imbalance
        return fold_layout(
            req.cost,
            self.topo,
            req.model,
            layout,
            seq,
            groups,
            self.r.precision,
            imb,
            recompute_spec(self.r),
            self.r.framework,
        )

    def _knobs(self, zero: int, off_opt: bool, off_par: bool, accum: int | None) -> Training:
        """The base training with one (ZeRO, offload) choice and, where the framework needs
        it, the accumulation regime (made once per plan)."""
        key = (zero, off_opt, off_par, accum)
        knobs = self._knob_cache.get(key)
        if knobs is None:
            update: dict[str, object] = {
                "zero_stage": zero,
                "offload_optimizer": off_opt,
                "offload_params": off_par,
            }
            if accum is not None:
                update["grad_accum"] = accum
            knobs = self.req.training.model_copy(update=update)
            self._knob_cache[key] = knobs
        return knobs

    def _curve(
        self,
        layout: Layout,
        lc: _Lazy,
        rc: Recompute,
        zero: int,
        off_opt: bool,
        off_par: bool,
        shard: int,
    ) -> CostCurve:
        key = (rc, zero, off_opt, off_par, shard)
        curve = lc.curves.get(key)
        if curve is None:  # the probe's curve is asked for again by the full sweep
            if lc.value is None:
                lc.value = self._layout_cost(layout, lc.groups, lc.bound)
            curve = cost_curve(
                self.req.cost, lc.value, rc, zero, off_opt, off_par, shard, self.r.precision
            )
            lc.curves[key] = curve
        return curve

    def runnable(self, layout: Layout) -> list[int] | None:
        """The micro-batches ``layout`` can run (its accumulation valid for the schedule), or
        None when the layout is invalid for the model (refused outside a parallelism search)
        or no micro-batch can run it (kept for the error message)."""
        req = self.req
        if req.global_batch % layout.dp:
            if req.search_parallelism:
                return None
            raise ConfigError(
                "global_batch_size",
                f"{req.global_batch} is not a multiple of DP = {layout.dp}",
                f"use a multiple of {layout.dp} (DP = GPUs / (tp * pp * cp))",
            )
        try:
            validate(req.model, layout, req.training, self.r, accumulation=False)
        except ConfigError:
            if req.search_parallelism:
                return None
            raise
        rows = req.global_batch // layout.dp
        key = (rows, layout.schedule, layout.pp, layout.vpp_group)
        micro = self._micro.get(key)
        if micro is None:
            micro = sorted(b for b in (req.micro_batches or divisors(rows)) if rows % b == 0)
            micro = self._micro[key] = [b for b in micro if _valid_accumulation(layout, rows // b)]
        if not micro:
            self.skipped.append(layout)
            return None
        return micro

    def lower_bound(self, layout: Layout, micro: list[int]) -> float:
        """Seconds no config of ``layout`` can beat (``bound.py``)."""
        return lower_bound(
            layout_bound(self._fold(layout)), micro, self.req.global_batch // layout.dp
        )

    def _fold(self, layout: Layout) -> FoldArgs:
        req, t = self.req, self.req.training
        return FoldArgs(
            req.cost, self.topo, req.model, layout, t.seq_len, req.convention, self.r,
            t.moe_imbalance,
        )  # fmt: skip

    def _choices(
        self, layout: Layout, lb: LayoutCost | None, micro: list[int], rows: int
    ) -> list[_Choice]:
        """The (ZeRO, offload) choices to sweep: all, or (bounded, ``lb`` the layout's
        ``bound_fold``) those with a config the step-time model lets reach the kept rows."""
        out = [
            (zero, off_opt, off_par)
            for zero in self.req.zero_stages
            for off_opt, off_par in self.offloads
            if not (off_par and zero != 3)
        ]
        if lb is None:
            return out
        t, cm, prec = self.kept.threshold, self.req.cost, self.r.precision
        split = fold_params(self._fold(layout))
        kept = []
        for z, o, p in out:
            if not self._states_fit(layout, split, z, o, p):
                continue
            curve = cost_curve(cm, lb, "none", z, o, p, 0, prec)
            if any(cost_at(curve, b, rows // b) < t for b in micro):
                kept.append((z, o, p))
        return kept

    def _states_fit(
        self, layout: Layout, split: Split, zero: int, off_opt: bool, off_par: bool
    ) -> bool:
        """Whether the model states of the device holding the most parameters, with the
        buffers, fit at all under one (ZeRO, offload) choice: every config of it needs at least
        that (activations, working sets and transients only add), so a choice that fails this
        is decided without the memory model's sweep (a traced profile has its own states).
        ``split``: the parameters of that device (``bound.fold_params``)."""
        req, r = self.req, self.r
        if req.training.implementation is not None:
            return True
        frameworks = req.convention != "paper"
        dp = layout.dp * (layout.cp if req.convention == "megatron" else 1)
        ms = model_states(
            split.non_moe,
            split.moe,
            dp,
            layout.edp,
            zero,
            r.precision,
            off_opt,
            off_par,
            frameworks,
        )
        grads = 0 if r.framework == "transformers" else ms.gradients  # freed between steps
        least = ms.weights + grads + ms.optimizer + r.comm_buffer_bytes
        return least + math.ceil(least * self.frag) + self.extra <= self.budget

    def layout(self, layout: Layout, micro: list[int], bounded: bool = False) -> bool:
        """Sweep every config of one runnable layout (``runnable`` gave ``micro``); bounded,
        only the (ZeRO, offload) choices that can reach the kept rows (by the layout's
        ``bound_fold``). False: nothing was left to sweep."""
        req, r = self.req, self.r
        rows = req.global_batch // layout.dp
        lb = bound_fold(self._fold(layout)) if bounded else None
        choices = self._choices(layout, lb, micro, rows)
        if not choices:
            return False
        self.layouts += 1
        self._dual.clear()  # keyed by the devices of this layout
        self._tables.clear()
        devices = prepare(req.model, layout, req.training, req.convention, r)
        groups = _groups(devices, layout, self._dual)
        lc = _Lazy(groups, lb)  # the layout's step-time figures, on its first config that fits
        # Frameworks that free gradients between steps hold them in forward/backward only when
        # accumulating: the single-micro-batch config (m = 1) is swept on its own.
        split = req.convention == "megatron" and (
            r.framework == "transformers" or req.training.implementation is not None
        )
        parts: list[tuple[list[int], int | None]] = [(micro, None)]
        if split and rows in micro:
            parts = [(micro[:-1], 2), ([rows], 1)] if len(micro) > 1 else [([rows], 1)]
        elif split:  # every config accumulates (m = 1 is not a valid schedule here)
            parts = [(micro, 2)]
        for zero, off_opt, off_par in choices:
            for part, accum in parts:
                knobs = self._knobs(zero, off_opt, off_par, accum)
                self._configs(layout, groups, lc, knobs, part, rows)
        return True

    def _reaches(
        self,
        layout: Layout,
        lc: _Lazy,
        choice: tuple[int, bool, bool, int],
        rc: Recompute,
        micro: list[int],
        rows: int,
    ) -> bool:
        """Whether a config of one (ZeRO, offload, recompute) choice is faster than the kept
        rows' slowest, by the step-time model alone (memory not asked)."""
        curve = self._curve(layout, lc, rc, *choice)
        t = self.kept.threshold
        return any(cost_at(curve, b, rows // b) < t for b in micro)

    def _configs(
        self,
        layout: Layout,
        groups: list[PreparedDevice],
        lc: _Lazy,
        knobs: Training,
        micro: list[int],
        rows: int,
    ) -> None:
        """Every (recompute, micro-batch) of one (ZeRO, offload) choice."""
        zero, off_opt, off_par = knobs.zero_stage, knobs.offload_optimizer, knobs.offload_params
        deepest = max(self.levels, key=RECOMPUTE_LEVELS.index)
        rows_st = self._rows(layout, groups, knobs, micro)
        key = (zero, off_opt, off_par, max(g.shard for g in rows_st))
        levels = self.levels
        if self.req.bound:  # the levels that can still reach the kept rows
            levels = tuple(rc for rc in levels if self._reaches(layout, lc, key, rc, micro, rows))
            if not levels:
                return
        # Probe the least memory-hungry config (most recompute, smallest micro-batch):
        # every other one of this (ZeRO, offload) needs at least as much, so if it does
        # not fit none does, and all are decided exactly without being swept.
        if rows_st[0].traced is None:
            b = micro[0]
            total, row, phase = peak(rows_st, deepest, b, rows // b, self.frag, self.extra)
            if total > self.budget:
                self.evaluated += len(levels) * len(micro)
                self._miss(layout, lc, key, deepest, rows_st, b, rows // b, (total, row, phase))
                return
        for rc in levels:
            self._sweep(layout, rows_st, lc, key, rc, micro, rows)

    def _miss(
        self,
        layout: Layout,
        lc: _Lazy,
        choice: tuple[int, bool, bool, int],
        rc: Recompute,
        rows_st: list[Row],
        b: int,
        m: int,
        found: tuple[int, Row, str],
    ) -> None:
        """Keep a config that does not fit if it is the closest miss so far."""
        total, row, phase = found
        if self.closest is not None and total >= hit_bytes(self.closest):
            return
        zero, off_opt, off_par, shard = choice
        curve = self._curve(layout, lc, rc, zero, off_opt, off_par, shard)
        host = self._host[0] if m == 1 else self._host[1]
        exact = (total, row.stage, phase)
        key = (zero, b, off_opt, off_par, rc)
        self.closest = (0.0, layout, key, rows_st, m, curve, host, False, exact)

    def _sweep(
        self,
        layout: Layout,
        rows_st: list[Row],
        lc: _Lazy,
        choice: tuple[int, bool, bool, int],
        rc: Recompute,
        micro: list[int],
        rows: int,
    ) -> None:
        """All micro-batch sizes for one (ZeRO, offload, recompute): the hot loop."""
        if rows_st[0].traced is not None:  # a traced profile: the replay, not linear terms
            self._traced_sweep(layout, rows_st, lc, choice, rc, micro, rows)
            return
        zero, off_opt, off_par, shard = choice
        frag, extra = self.frag, self.extra
        n = len(micro)
        self.evaluated += n
        k, listed = fit_prefix(rows_st, rc, micro, rows, frag, extra, self.budget)
        fit = range(k) if listed is None else listed
        if len(fit) < n:  # the closest miss of this sweep: the first one that does not fit
            i = k if listed is None else min(set(range(n)) - set(listed))
            b = micro[i]
            found = peak(rows_st, rc, b, rows // b, frag, extra)
            self._miss(layout, lc, choice, rc, rows_st, b, rows // b, found)
        if not fit:
            return
        near_from = k  # the fitting configs from this index on are near the limit
        if listed is None:
            near_from = fit_prefix(rows_st, rc, micro[:k], rows, frag, extra, self.near)[0]
        curve: CostCurve | None = None  # folded on the first config that fits
        host_1, host_m = self._host
        fitting = self.fitting
        for i in fit:
            b = micro[i]
            m = rows // b
            host = host_1 if m == 1 else host_m
            if host > self.host_budget:  # fits the GPU, not the host: does not fit
                self._host_limited((zero, b, off_opt, off_par, rc), host)
                continue
            if curve is None:
                curve = self._curve(layout, lc, rc, zero, off_opt, off_par, shard)
            near = i >= near_from
            if listed is not None:
                near = peak(rows_st, rc, b, m, frag, extra)[0] > self.near
            key = (zero, b, off_opt, off_par, rc)
            fitting.append((cost_at(curve, b, m), layout, key, rows_st, m, curve, host, near, None))

    def flush(self) -> None:
        """Close one base layout: each config once with its best split (fastest; on a tie the
        one needing less memory), counted, and kept if it is among the ``limit`` best."""
        best: dict[_Key, _Hit] = {}
        for hit in self.fitting:
            old = best.get(hit[2])
            if old is None or hit[0] < old[0] or (hit[0] == old[0] and self._less(hit, old)):
                best[hit[2]] = hit
        self.fitting.clear()
        self.host_limited += len(self._limited - best.keys())
        self._limited.clear()
        for hit in best.values():
            self.count += 1
            self.near_count += hit[7]
            self.kept.offer(hit[0], (hit, self))

    def _less(self, a: _Hit, b: _Hit) -> bool:
        """Whether config ``a`` needs fewer bytes than ``b`` (exact, for a tie in step time)."""
        return self._exact(a)[0] < self._exact(b)[0]

    def _exact(self, hit: _Hit) -> _Exact:
        """(total, peak stage, phase) of a fitting config, from its rows when not kept."""
        if hit[8] is not None:
            return hit[8]
        _, b, _, _, rc = hit[2]
        total, row, phase = peak(hit[3], rc, b, hit[4], self.frag, self.extra)
        return total, row.stage, phase

    def _host_limited(self, key: _Key, host: int) -> None:
        """A config that fits the GPU but not the host (counted at ``flush`` if no split of
        it fits both)."""
        self._limited.add(key)
        if self.host_limited_bytes is None or host < self.host_limited_bytes:
            self.host_limited_bytes = host

    def _traced_sweep(
        self,
        layout: Layout,
        rows_st: list[Row],
        lc: _Lazy,
        choice: tuple[int, bool, bool, int],
        rc: Recompute,
        micro: list[int],
        rows: int,
    ) -> None:
        """``_sweep`` for a traced profile: each device's peak from its replay, exactly as
        ``estimate`` computes it; slower than the linear loop, the same answers."""
        zero, off_opt, off_par, shard = choice
        host_1, host_m = self._host
        curve: CostCurve | None = None
        for b in micro:
            m = rows // b
            total, row, phase = _traced_peak(rows_st, layout, rc, b, m, self.frag, self.extra)
            host = host_1 if m == 1 else host_m
            self.evaluated += 1
            if total > self.budget:
                self._miss(layout, lc, choice, rc, rows_st, b, m, (total, row, phase))
                continue
            if host > self.host_budget:  # fits the GPU, not the host: does not fit
                self._host_limited((zero, b, off_opt, off_par, rc), host)
                continue
            if curve is None:
                curve = self._curve(layout, lc, rc, zero, off_opt, off_par, shard)
            key = (zero, b, off_opt, off_par, rc)
            exact = (total, row.stage, phase)
            near = total > self.near
            self.fitting.append(
                (cost_at(curve, b, m), layout, key, rows_st, m, curve, host, near, exact)
            )

    def _rows(
        self, layout: Layout, groups: list[PreparedDevice], knobs: Training, micro: list[int]
    ) -> list[Row]:
        """The inner loop's rows; sets ``self._host`` (host bytes per node with one micro-batch
        per step, and with accumulation) from the same states."""
        out = []
        host_1 = host_m = 0
        accum = knobs.offload_optimizer and knobs.zero_stage < 3 and self.req.convention != "paper"
        pp, sched = layout.pp, layout.schedule
        for g in groups:
            s = states(g, layout, knobs, self.req.convention, self.r, self.ov)
            host_1 = max(host_1, s.host, s.host_init)
            host_m = max(host_m, s.host_init, self._accumulating(s, knobs) if accum else s.host)
            acts, fixed, table = g.stages[0].acts, 1 if pp == 1 else 0, None
            # In-flight bytes depend on the device and the micro-batches, not on the (ZeRO,
            # offload) choice: computed once per layout (the planner's hot path).
            if sched == "dualpipe" and pp > 1:  # fixed counts: PP - j for each held stage j
                dual = self._dual.get(id(g))
                if dual is None:
                    dual = in_flight_levels(g, layout, 2 * pp)
                    self._dual[id(g)] = dual
                acts, fixed = dual, 1
            elif sched == "interleaved" and pp > 1:
                table = self._tables.get(id(g))
                if table is None:
                    table = self._tables[id(g)] = InFlight(g, layout)
            out.append(
                Row(
                    g.index,
                    pp - g.index,
                    fixed,
                    acts,
                    g.works,
                    g.consts,
                    table,
                    s.static + s.working_set + self.r.comm_buffer_bytes,
                    s.static + s.transient,
                    s.ms.shard_params,
                    _NO_TAILS
                    if s.tail is None and not g.stages[0].moments
                    else {rc: tuple(tails(g, s, knobs, self.r, rc)) for rc in RECOMPUTE_LEVELS},
                    *self._traced(g, layout, knobs, s),
                )
            )
        n = self.req.gpus_per_node
        self._host = (host_1 * n, host_m * n)
        return out

    def _traced(
        self, g: PreparedDevice, layout: Layout, knobs: Training, s: States
    ) -> tuple[PreparedDevice | None, dict[Recompute, TracedStage] | None]:
        """A traced profile's replay of device ``g`` at each planned level (else nothing)."""
        prof = knobs.implementation
        if not isinstance(prof, TracedProfile):
            return None, None
        return g, {
            rc: traced_device(
                prof, g, layout, knobs.model_copy(update={"recompute": rc}), s.ms.gradients
            )
            for rc in self.levels
        }

    def _accumulating(self, s: States, knobs: Training) -> int:
        """Host bytes per GPU of ``s`` when the step accumulates micro-batches (DeepSpeed keeps
        a 16-bit gradient copy on the host between micro-steps), exactly as ``estimate``."""
        exact = host_states(s.ms.shard_params, knobs.zero_stage, self.r.precision, True, False, 2)
        return with_overhead(exact, self.ov.host_overhead)

    def candidate(self, hit: _Hit) -> Candidate:
        _, layout, key, _rows, m, curve, host, near, _known = hit
        zero, b, off_opt, off_par, rc = key
        total, stage, phase = self._exact(hit)
        t = self.req.training.model_copy(
            update={
                "micro_batch": b,
                "grad_accum": m,
                "recompute": rc,
                "zero_stage": zero,
                "offload_optimizer": off_opt,
                "offload_params": off_par,
            }
        )
        cost = cost_terms(curve, b, m)
        return Candidate(
            layout=layout,
            training=t,
            peak_bytes=total,
            peak_stage=stage,
            phase=phase,
            fits=total <= self.budget,
            headroom_bytes=self.req.gpu_memory_bytes - total,
            step_time_s=cost["total"],
            cost_terms=cost,
            traffic=traffic(curve, b, m),
            host_bytes_per_node=host,
            near_limit=near,
        )


def hit_bytes(hit: _Hit) -> int:
    """The peak bytes a miss was kept with (misses always carry them)."""
    return hit[8][0] if hit[8] is not None else 0


def _traced_peak(
    rows_st: list[Row], layout: Layout, rc: Recompute, b: int, m: int, frag: float, extra: int
) -> tuple[int, Row, str]:
    """A traced profile's peak of one config: each device's replay, as ``estimate`` has it."""
    best, row, fb_best, opt_best = -1, rows_st[0], 0, 0
    for g in rows_st:
        assert g.traced is not None and g.device is not None  # every traced row has them
        n = traced_in_flight(g.device, layout, rc, m)
        fb = g.base_fb + g.traced[rc].forward_backward(b, n)[0]
        opt = g.opt + g.traced[rc].batch(b)
        if max(fb, opt) > best:
            best, row, fb_best, opt_best = max(fb, opt), g, fb, opt
    phase = "forward-backward" if fb_best >= opt_best else "optimizer-step"
    return best + math.ceil(best * frag) + extra, row, phase


def _traced_levels(req: PlanRequest, levels: tuple[Recompute, ...]) -> tuple[Recompute, ...]:
    """Recompute levels to plan: a traced profile's own (a level it lacks is not planned)."""
    prof = req.training.implementation
    if not isinstance(prof, TracedProfile):
        return levels
    held = tuple(rc for rc in levels if rc in prof.levels)
    if not held:
        raise ConfigError(
            "--recompute",
            f"none of {', '.join(levels)} is in the profile (traced: {', '.join(prof.levels)})",
            "plan the levels the profile holds, or calibrate them",
        )
    return held
