"""Find the configs that fit a GPU, cheapest first, with the global batch exact.

The search varies micro-batch (with the matching gradient accumulation, so that
micro x accumulation x DP = global batch always), recompute level, ZeRO stage, offload and,
on request, TP/PP/EP. It is fast because activations are linear in the micro-batch: each
layout's per-sample activation bytes and model states are computed once, and every
(recompute, ZeRO, offload, micro-batch) combination is then a few multiplications per stage
using exactly the arithmetic of ``estimate`` (so a planned config re-estimates to the same bytes).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dssup.errors import ConfigError
from dssup.memory.config import RECOMPUTE_LEVELS, Convention, Layout, Overheads, Recompute, Training
from dssup.memory.core import PreparedDevice, States, device_in_flight, prepare, states, tails
from dssup.memory.cost import CostModel, LayoutCost
from dssup.memory.curve import CostCurve, cost_at, cost_curve, cost_terms, traffic
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.layouts import search_layouts
from dssup.memory.offload import host_states, with_overhead
from dssup.memory.params import model_total
from dssup.memory.schedule import check_micro_batches
from dssup.memory.spec import ModelSpec
from dssup.memory.steptime import fold_layout, recompute_spec
from dssup.memory.topology import Topology, default_topology
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_device import traced_device, traced_in_flight
from dssup.memory.traced_stage import TracedStage, check_profile, without_untraced_mtp
from dssup.memory.validate import check_split, divisors, validate

__all__ = ["Candidate", "PlanRequest", "PlanResult", "plan"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class PlanRequest(BaseModel):
    """What to plan for. ``layout`` fixes TP/PP/EP/ETP/CP/schedule unless ``search_parallelism``."""

    model_config = _FROZEN
    model: ModelSpec
    gpu_memory_bytes: int = Field(gt=0, description="usable memory per GPU, bytes")
    global_batch: int = Field(gt=0, description="sequences per optimizer step; kept exact")
    world_size: int | None = Field(None, gt=0, description="GPUs; default layout.world_size")
    layout: Layout = Field(default_factory=Layout)
    training: Training = Field(default_factory=Training, description="base knobs (seq_len, ...)")
    overheads: Overheads | None = None
    convention: Convention = "megatron"
    recompute: tuple[Recompute, ...] = RECOMPUTE_LEVELS
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    allow_offload: bool = Field(True, description="consider optimizer and parameter offload")
    search_parallelism: bool = Field(
        False,
        description="also vary TP, PP, EP and the pipeline schedule (1F1B, interleaved "
        "VPP, DualPipe for MoE models)",
    )
    fixed: tuple[Literal["tp", "pp", "ep", "schedule", "vpp"], ...] = Field(
        (), description="layout fields the parallelism search keeps as given in ``layout``"
    )
    offloads: tuple[Literal["none", "optimizer", "both"], ...] | None = Field(
        None, description="offload choices to consider; None: all when allow_offload"
    )
    max_tp: int = Field(8, ge=1, description="largest TP to consider (one node)")
    max_vpp: int = Field(
        32, ge=1, description="largest virtual-pipeline size the search tries (interleaved)"
    )
    micro_batches: tuple[int, ...] | None = Field(None, description="None = every divisor")
    margin: float = Field(0.05, ge=0, lt=1, description="fraction of GPU memory kept free")
    cost: CostModel = Field(default_factory=CostModel, description="step-time model settings")
    topology: Topology | None = Field(
        None,
        description="GPUs, links and hosts the step time is for; None: an H100 DGX node "
        "from the GPU table, with a warning",
    )
    limit: int = Field(50, ge=1, description="most candidates returned")
    host_memory_bytes: int | None = Field(
        None, gt=0, description="host memory per node, bytes; None = not checked"
    )
    gpus_per_node: int = Field(8, ge=1, description="GPUs sharing one host (per node)")


class Candidate(BaseModel):
    """One config, its predicted peak and its cost."""

    model_config = _FROZEN
    layout: Layout
    training: Training
    peak_bytes: int
    peak_stage: int
    phase: str
    fits: bool
    headroom_bytes: int
    step_time_s: float = Field(description="predicted seconds per optimizer step")
    cost_terms: dict[str, float] = Field(
        description="the step time by term, seconds; 'total' is their sum (docs/step-time.md)"
    )
    traffic: dict[str, float] = Field(
        default_factory=dict, description="seconds of each communication per step before overlap"
    )
    host_bytes_per_node: int = Field(
        0, description="gpus_per_node x the largest per-GPU host need (offload, model build)"
    )


class PlanResult(BaseModel):
    model_config = _FROZEN
    candidates: list[Candidate] = Field(description="configs that fit, cheapest first")
    evaluated: int = Field(description="configs whose memory was computed")
    fitting: int = Field(description="configs that fit (before the limit)")
    closest: Candidate | None = Field(description="smallest peak among those that do not fit")
    closest_fits_gpu: bool = Field(
        False, description="the closest config fits the GPU and misses only the margin"
    )
    topology: Topology = Field(description="the hardware the step times were computed for")
    warnings: list[str] = Field(default_factory=list, description="inputs that were missing")
    host_limited: int = Field(0, description="configs that fit the GPU but not the host memory")
    host_limited_bytes: int | None = Field(
        None, description="smallest host need per node among the host-limited configs"
    )


def _world(req: PlanRequest) -> int:
    return req.world_size or req.layout.world_size


def _layouts(req: PlanRequest) -> Iterator[Layout]:
    base, world, m = req.layout, _world(req), req.model
    if not req.search_parallelism:
        mp = base.tp * base.pp * base.cp
        if world % mp:
            raise ConfigError(
                "world_size",
                f"{world} GPUs is not a multiple of tp*pp*cp={mp}",
                "change the GPU count or the layout",
            )
        yield base.model_copy(update={"dp": world // mp})
        return
    if base.layers_per_stage is not None:  # else every layout of its PP is skipped unseen
        check_split(m, base.layers_per_stage)
        if world % (base.pp * base.cp):
            raise ConfigError(
                "layers_per_stage",
                f"its {base.pp} pipeline stages (cp {base.cp}) do not divide {world} GPUs",
                "give one layer count per stage of a PP that divides the GPU count",
            )
    dualpipe = req.training.framework == "deepseek"
    yield from search_layouts(m, base, world, req.max_tp, req.max_vpp, req.fixed, dualpipe)


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
    by_rc = {rc: device_in_flight(dev, layout, rc, 2 * layout.pp)[0] for rc in RECOMPUTE_LEVELS}
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
    try:
        check_micro_batches(layout, m)
    except ConfigError:
        return False
    return True


_OFFLOAD = {"none": (False, False), "optimizer": (True, False), "both": (True, True)}
_Key = tuple[int, int, bool, bool, Recompute]
_Hit = tuple[float, int, Layout, _Key, int, str, int, CostCurve, int]


class _Row(NamedTuple):
    """One device kind under one (ZeRO, offload) choice: what the inner loop reads."""

    stage: int
    depth: int  # pp - index: 1F1B in-flight bound
    fixed: int  # in-flight count independent of m (pp == 1, DualPipe); 0 = use depth/m
    acts: dict[Recompute, int]  # per-sample bytes of one in-flight unit (DualPipe: all of them)
    work: dict[Recompute, int]  # per-sample backward working set, once per device
    const: dict[Recompute, int]  # batch-independent saved bytes (autocast copies)
    table: dict[Recompute, dict[int, int]] | None  # interleaved: m -> in-flight per-sample bytes
    base_fb: int
    opt: int
    shard: int
    # later backward moments (eager end of backward, freed gradients): per level, pairs of
    # (batch-independent bytes with static and buffers, per-sample bytes)
    tails: dict[Recompute, tuple[tuple[int, int], ...]]
    device: PreparedDevice | None = None  # a traced profile: the device to replay
    traced: dict[Recompute, TracedStage] | None = None  # a traced profile: replay by level


_NO_TAILS: dict[Recompute, tuple[tuple[int, int], ...]] = dict.fromkeys(RECOMPUTE_LEVELS, ())


def _monotone(table: dict[int, int], micro: list[int], rows: int) -> bool:
    """Whether b * in-flight bytes never falls as b grows (so a miss decides larger b too)."""
    seq = [table[rows // b] * b for b in micro]
    return all(x <= y for x, y in itertools.pairwise(seq))


class _Lazy:
    """A layout's ``LayoutCost``, folded only if one of its configs fits (most do not)."""

    __slots__ = ("curves", "groups", "value")

    def __init__(self, groups: list[PreparedDevice]) -> None:
        self.groups = groups
        self.value: LayoutCost | None = None
        self.curves: dict[tuple[Recompute, int, bool, bool, int], CostCurve] = {}


class _Search:
    """The inner loop: integer arithmetic only, identical to ``estimate``'s; the step time is
    ``cost_at`` on a curve folded once per (layout, ZeRO, offload, recompute)."""

    def __init__(self, req: PlanRequest, topo: Topology, allow_offload: bool) -> None:
        self.req = req
        self.topo = topo
        self.allow_offload = allow_offload
        self.ov = req.overheads or Overheads()
        self.r: Resolved = resolve(req.convention, req.training, self.ov)
        # Eager frameworks checkpoint whole layers only: no selective level to search.
        eager = req.convention == "megatron" and self.r.framework in ("transformers", "deepspeed")
        self.levels = tuple(rc for rc in req.recompute if not (eager and rc == "selective"))
        self.levels = _traced_levels(req, self.levels)
        self.budget = int(req.gpu_memory_bytes * (1.0 - req.margin))
        kinds = req.offloads or (("none", "optimizer", "both") if allow_offload else ("none",))
        if not allow_offload:
            kinds = tuple(k for k in kinds if k == "none")
        self.offloads = [_OFFLOAD[k] for k in kinds]
        self._knob_cache: dict[tuple[int, bool, bool, int | None], Training] = {}
        self.layouts = 0  # layouts whose configs were evaluated
        # in-flight bytes per device of the current layout (they do not depend on ZeRO/offload)
        self._dual: dict[int, dict[Recompute, int]] = {}
        self._tables: dict[tuple[int, int, int], dict[Recompute, dict[int, int]]] = {}
        self.skipped: list[Layout] = []  # layouts no micro-batch choice could run
        self.evaluated = 0
        self.fitting: list[_Hit] = []
        self.closest: _Hit | None = None
        self.host_budget = req.host_memory_bytes or (1 << 62)
        self.host_limited = 0
        self.host_limited_bytes: int | None = None
        self.gpu_fits = 0
        self._host = (0, 0)  # host bytes per node of the current (ZeRO, offload): m = 1, m > 1

    def _layout_cost(self, layout: Layout, groups: list[PreparedDevice]) -> LayoutCost:
        """Step-time figures of ``layout`` (the same folding ``step_time`` uses)."""
        req = self.req
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
                lc.value = self._layout_cost(layout, lc.groups)
            curve = cost_curve(
                self.req.cost, lc.value, rc, zero, off_opt, off_par, shard, self.r.precision
            )
            lc.curves[key] = curve
        return curve

    def layout(self, layout: Layout) -> None:
        req, r = self.req, self.r
        try:
            validate(req.model, layout, req.training, r, accumulation=False)
        except ConfigError:
            if req.search_parallelism:
                return
            raise
        rows = req.global_batch // layout.dp
        micro = sorted(b for b in (req.micro_batches or divisors(rows)) if rows % b == 0)
        micro = [b for b in micro if _valid_accumulation(layout, rows // b)]
        if not micro:
            self.skipped.append(layout)
            return
        self.layouts += 1
        self._dual.clear()  # keyed by the devices of this layout
        self._tables.clear()
        devices = prepare(req.model, layout, req.training, req.convention, r)
        groups = _groups(devices, layout, self._dual)
        lc = _Lazy(groups)  # the layout's step-time figures, on its first config that fits
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
        for zero in req.zero_stages:
            for off_opt, off_par in self.offloads:
                if off_par and zero != 3:
                    continue
                for part, accum in parts:
                    knobs = self._knobs(zero, off_opt, off_par, accum)
                    self._configs(layout, groups, lc, knobs, part, rows)

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
        # Probe the least memory-hungry config (most recompute, smallest micro-batch):
        # every other one of this (ZeRO, offload) needs at least as much, so if it does
        # not fit none does, and all are decided exactly without being swept.
        before, gpu_fits, limited = len(self.fitting), self.gpu_fits, self.host_limited
        self._sweep(layout, rows_st, lc, key, deepest, micro[:1], rows)
        if self.gpu_fits == gpu_fits:
            self.evaluated += len(self.levels) * len(micro) - 1
            return
        del self.fitting[before:]  # the sweeps below evaluate it again
        self.gpu_fits, self.host_limited = gpu_fits, limited
        self.evaluated -= 1
        for rc in self.levels:
            self._sweep(layout, rows_st, lc, key, rc, micro, rows)

    def _sweep(
        self,
        layout: Layout,
        rows_st: list[_Row],
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
        r, ov = self.r, self.ov
        zero, off_opt, off_par, shard = choice
        frag, extra, budget = (
            r.fragmentation,
            r.cuda_context_bytes + ov.calibration_bytes,
            self.budget,
        )
        table = [
            (
                g,
                g.fixed,
                g.depth,
                g.acts[rc],
                None if g.table is None else g.table[rc],
                g.base_fb + g.const[rc],
                g.work[rc],
                g.opt,
                g.tails[rc],
            )
            for g in rows_st
        ]
        monotone = rows_st[0].table is None or all(
            _monotone(g.table[rc], micro, rows) for g in rows_st if g.table is not None
        )
        curve: CostCurve | None = None  # folded on the first config that fits
        fitting = self.fitting
        host_1, host_m = self._host
        host_budget = self.host_budget
        i = -1
        for i, b in enumerate(micro):
            m = rows // b
            best, row, fb_best = -1, rows_st[0], 0
            for g, fixed, depth, a, vt, base_fb, work, opt, later in table:
                acts = a * (fixed or (depth if depth < m else m)) if vt is None else vt[m]
                fb = base_fb + (acts + work) * b
                for const, per in later:  # a later backward moment can top its start
                    fb = max(fb, const + per * b)
                alloc = fb if fb >= opt else opt
                if alloc > best:
                    best, row, fb_best = alloc, g, fb
            total = best + math.ceil(best * frag) + extra
            phase = "forward-backward" if fb_best >= row.opt else "optimizer-step"
            key = (zero, b, off_opt, off_par, rc)
            host = host_1 if m == 1 else host_m
            if total <= budget:
                self.gpu_fits += 1
                if host > host_budget:  # fits the GPU, not the host: does not fit
                    self.host_limited += 1
                    if self.host_limited_bytes is None or host < self.host_limited_bytes:
                        self.host_limited_bytes = host
                    continue
                if curve is None:
                    curve = self._curve(layout, lc, rc, zero, off_opt, off_par, shard)
                fitting.append(
                    (cost_at(curve, b, m), total, layout, key, row.stage, phase, m, curve, host)
                )
                continue
            if self.closest is None or total < self.closest[1]:
                if curve is None:
                    curve = self._curve(layout, lc, rc, zero, off_opt, off_par, shard)
                self.closest = (0.0, total, layout, key, row.stage, phase, m, curve, host)
            # The peak only grows with b (a * b * min(PP - i, rows / b) = a * min(b * (PP - i),
            # rows)), so every larger micro-batch is decided too: it does not fit either
            # (interleaved tables are checked to grow too, else the sweep goes on).
            if not monotone:
                continue
            self.evaluated += len(micro) - i - 1
            break
        self.evaluated += min(len(micro), i + 1)

    def _traced_sweep(
        self,
        layout: Layout,
        rows_st: list[_Row],
        lc: _Lazy,
        choice: tuple[int, bool, bool, int],
        rc: Recompute,
        micro: list[int],
        rows: int,
    ) -> None:
        """``_sweep`` for a traced profile: each device's peak from its replay, exactly as
        ``estimate`` computes it; slower than the linear loop, the same answers."""
        r, ov = self.r, self.ov
        zero, off_opt, off_par, shard = choice
        host_1, host_m = self._host
        curve: CostCurve | None = None
        for b in micro:
            m = rows // b
            best, row, fb_best, opt_best = -1, rows_st[0], 0, 0
            for g in rows_st:
                assert g.traced is not None and g.device is not None  # every traced row has them
                n = traced_in_flight(g.device, layout, rc, m)
                fb = g.base_fb + g.traced[rc].forward_backward(b, n)[0]
                opt = g.opt + g.traced[rc].batch(b)
                if max(fb, opt) > best:
                    best, row, fb_best, opt_best = max(fb, opt), g, fb, opt
            total = best + math.ceil(best * r.fragmentation) + r.cuda_context_bytes
            total += ov.calibration_bytes
            phase = "forward-backward" if fb_best >= opt_best else "optimizer-step"
            key = (zero, b, off_opt, off_par, rc)
            host = host_1 if m == 1 else host_m
            self.evaluated += 1
            if curve is None:
                curve = self._curve(layout, lc, rc, zero, off_opt, off_par, shard)
            if total > self.budget:
                if self.closest is None or total < self.closest[1]:
                    self.closest = (0.0, total, layout, key, row.stage, phase, m, curve, host)
                continue
            self.gpu_fits += 1
            if host > self.host_budget:  # fits the GPU, not the host: does not fit
                self.host_limited += 1
                if self.host_limited_bytes is None or host < self.host_limited_bytes:
                    self.host_limited_bytes = host
                continue
            hit = (cost_at(curve, b, m), total, layout, key, row.stage, phase, m, curve, host)
            self.fitting.append(hit)

    def _rows(
        self, layout: Layout, groups: list[PreparedDevice], knobs: Training, micro: list[int]
    ) -> list[_Row]:
        """The inner loop's rows; sets ``self._host`` (host bytes per node with one micro-batch
        per step, and with accumulation) from the same states."""
        out = []
        host_1 = host_m = 0
        accum = knobs.offload_optimizer and knobs.zero_stage < 3 and self.req.convention != "paper"
        pp, sched = layout.pp, layout.schedule
        rows = self.req.global_batch // layout.dp
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
                    dual = {
                        rc: device_in_flight(g, layout, rc, 2 * pp)[0] for rc in RECOMPUTE_LEVELS
                    }
                    self._dual[id(g)] = dual
                acts, fixed = dual, 1
            elif sched == "interleaved" and pp > 1:
                key = (id(g), len(micro), micro[0])
                table = self._tables.get(key)
                if table is None:
                    table = {
                        rc: {
                            rows // b: device_in_flight(g, layout, rc, rows // b)[0] for b in micro
                        }
                        for rc in self.levels
                    }
                    self._tables[key] = table
            out.append(
                _Row(
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
        _, total, layout, key, stage, phase, m, curve, host = hit
        zero, b, off_opt, off_par, rc = key
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
        )


def _nothing_to_search(req: PlanRequest, skipped: list[Layout]) -> ConfigError:
    """Why no config could even be evaluated: a pinned micro-batch that divides nothing, a
    schedule that refuses every accumulation count (``schedule.check_micro_batches``), or
    pinned layout fields that leave no layout."""
    if skipped:
        lay = skipped[0]
        rows = req.global_batch // lay.dp
        micro = [b for b in (req.micro_batches or divisors(rows)) if rows % b == 0]
        if not micro:
            return ConfigError(
                "micro_batch",
                f"{(req.micro_batches or (0,))[0]} does not divide the {rows} sequences per DP "
                "rank",
                "pick a divisor of global batch / DP, or leave --micro-batch out",
            )
        try:
            check_micro_batches(lay, rows // micro[0])
        except ConfigError as exc:
            return ConfigError("global_batch_size", exc.problem, exc.fix)
    pins = ", ".join(f"--{f} {getattr(req.layout, f)}" for f in req.fixed)
    if pins:
        return ConfigError(
            req.fixed[0],
            f"no valid layout for {_world(req)} GPUs with {pins}",
            "change or drop the pinned values (TP, PP, EP and VPP must divide the GPUs, heads, "
            "layers and experts)",
        )
    return ConfigError(
        "global_batch_size",
        f"no layout of {_world(req)} GPUs has a DP that divides {req.global_batch}",
        "use a global batch with more factors of two, or another GPU count",
    )


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


def plan(req: PlanRequest) -> PlanResult:
    """Every config in the search space that fits, ranked by the step-time model (``cost.py``)."""
    prof = req.training.implementation
    if isinstance(prof, TracedProfile):
        model, _ = without_untraced_mtp(req.model, prof)
        check_profile(prof, model_total(model, "megatron"), next(iter(prof.levels)))
        req = req.model_copy(update={"model": model})
    warnings: list[str] = []
    topo = req.topology
    if topo is None:
        topo = default_topology()
        warnings.append(
            f"no GPU given for the step-time model: ranking assumes {topo.gpu} "
            f"({topo.gpus_per_node} GPUs per node); pass the GPU to rank for your machine"
        )
    if req.cost.compute_dtype == "fp8" and topo.fp8_flops is None:
        raise ConfigError(
            "compute_dtype",
            f"{topo.gpu} has no FP8 tensor cores",
            "use --compute-dtype bf16 (or a GPU with FP8, e.g. H100)",
        )
    if req.offloads and set(req.offloads) - {"none"} and topo.host_cpu_cores is None:
        raise ConfigError(
            "host_cores",
            f"offload was asked for but the host CPU cores per node of {topo.gpu} are unknown",
            "pass --host-cores N (physical cores per node) so CPU Adam can be timed",
        )
    allow_offload = req.allow_offload
    if allow_offload and topo.host_cpu_cores is None:
        allow_offload = False
        warnings.append(
            f"CPU offload not considered: host CPU cores per node unknown for {topo.gpu} "
            "(pass --host-cores N to rank offload)"
        )
    search = _Search(req, topo, allow_offload)
    for layout in _layouts(req):
        if req.global_batch % layout.dp == 0:
            search.layout(layout)
        elif not req.search_parallelism:
            raise ConfigError(
                "global_batch_size",
                f"{req.global_batch} is not a multiple of DP = {layout.dp}",
                f"use a multiple of {layout.dp} (DP = GPUs / (tp * pp * cp))",
            )
    if not search.layouts:
        raise _nothing_to_search(req, search.skipped)
    search.fitting.sort(key=lambda row: (row[0], row[1]))
    chosen = [search.candidate(hit) for hit in search.fitting[: req.limit]]
    closest = None
    if not chosen and search.closest is not None:
        closest = search.candidate(search.closest)
    return PlanResult(
        candidates=chosen,
        evaluated=search.evaluated,
        fitting=len(search.fitting),
        closest=closest,
        closest_fits_gpu=closest is not None and closest.peak_bytes <= req.gpu_memory_bytes,
        topology=topo,
        warnings=warnings,
        host_limited=search.host_limited,
        host_limited_bytes=search.host_limited_bytes,
    )
