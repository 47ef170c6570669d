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
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dssup.errors import ConfigError
from dssup.memory.config import RECOMPUTE_LEVELS, Convention, Layout, Overheads, Recompute, Training
from dssup.memory.core import PreparedDevice, States, device_in_flight, prepare, states, tails
from dssup.memory.cost import CostModel, cost_at, cost_curve, step_cost
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.offload import host_states, with_overhead
from dssup.memory.params import model_total
from dssup.memory.schedule import check_micro_batches
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_device import traced_device, traced_in_flight
from dssup.memory.traced_stage import TracedStage, check_profile, without_untraced_mtp
from dssup.memory.validate import divisors, validate

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
    search_parallelism: bool = Field(False, description="also vary TP, PP and EP")
    max_tp: int = Field(8, ge=1, description="largest TP to consider (one node)")
    micro_batches: tuple[int, ...] | None = Field(None, description="None = every divisor")
    margin: float = Field(0.05, ge=0, lt=1, description="fraction of GPU memory kept free")
    cost: CostModel = Field(default_factory=CostModel)
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
    step_time_s: float
    cost_terms: dict[str, float]
    host_bytes_per_node: int = Field(
        0, description="gpus_per_node x the largest per-GPU host need (offload, model build)"
    )


class PlanResult(BaseModel):
    model_config = _FROZEN
    candidates: list[Candidate] = Field(description="configs that fit, cheapest first")
    evaluated: int = Field(description="configs whose memory was computed")
    fitting: int = Field(description="configs that fit (before the limit)")
    closest: Candidate | None = Field(description="smallest peak among those that do not fit")
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
    eps = divisors(m.moe.n_routed) if m.moe else [1]
    for tp in (d for d in divisors(world, req.max_tp) if d & (d - 1) == 0):
        for pp in divisors(world // (tp * base.cp), m.layers):
            dp = world // (tp * pp * base.cp)
            for ep in eps:
                if (tp * base.cp * dp) % (ep * base.etp):
                    continue
                yield base.model_copy(
                    update={
                        "tp": tp,
                        "pp": pp,
                        "dp": dp,
                        "ep": ep,
                        "layers_per_stage": None if pp != base.pp else base.layers_per_stage,
                    }
                )


def _groups(devices: list[PreparedDevice], layout: Layout) -> list[PreparedDevice]:
    """One device per kind. 1F1B: devices with equal parameters and activations peak at the
    lowest index (it holds the most in-flight micro-batches); DualPipe: ranks i and PP-1-i
    hold the same two stages with the same counts; interleaved: every rank differs."""
    if layout.schedule == "interleaved" and layout.pp > 1:
        return devices
    seen: dict[tuple[object, ...], PreparedDevice] = {}
    for dev in devices:
        if layout.schedule == "dualpipe":
            key: tuple[object, ...] = tuple(sorted(st.index for st in dev.stages))
        else:
            st = dev.stages[0]
            key = (dev.split, tuple(sorted(st.acts.items())), dev.largest_layer)
            key += (tuple(sorted(st.work.items())), st.params.embedding * st.params.first)
        seen.setdefault(key, dev)
    return list(seen.values())


def _valid_accumulation(layout: Layout, m: int) -> bool:
    try:
        check_micro_batches(layout, m)
    except ConfigError:
        return False
    return True


def _active_params(m: ModelSpec) -> int:
    total = model_total(m, "megatron")
    if m.moe is None:
        return total
    inactive = (m.moe.n_routed - m.moe.top_k) * 3 * m.hidden * m.moe.expert_ffn
    return total - inactive * m.moe_layer_count


_Key = tuple[int, int, bool, bool, Recompute]
_Hit = tuple[float, int, Layout, _Key, int, str, int, int, int, int]


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


class _Search:
    """The inner loop: integer arithmetic only, identical to ``estimate``'s."""

    def __init__(self, req: PlanRequest) -> None:
        self.req = req
        self.ov = req.overheads or Overheads()
        self.r: Resolved = resolve(req.convention, req.training, self.ov)
        # Eager frameworks checkpoint whole layers only: no selective level to search.
        eager = req.convention == "megatron" and self.r.framework in ("transformers", "deepspeed")
        self.levels = tuple(rc for rc in req.recompute if not (eager and rc == "selective"))
        self.levels = _traced_levels(req, self.levels)
        self.budget = int(req.gpu_memory_bytes * (1.0 - req.margin))
        self.active = _active_params(req.model)
        self.evaluated = 0
        self.fitting: list[_Hit] = []
        self.closest: _Hit | None = None
        self.host_budget = req.host_memory_bytes or (1 << 62)
        self.host_limited = 0
        self.host_limited_bytes: int | None = None
        self.gpu_fits = 0
        self._host = (0, 0)  # host bytes per node of the current (ZeRO, offload): m = 1, m > 1

    def layout(self, layout: Layout) -> None:
        req, r = self.req, self.r
        try:
            validate(req.model, layout, req.training, r, accumulation=False)
        except ConfigError:
            if req.search_parallelism:
                return
            raise
        groups = _groups(prepare(req.model, layout, req.training, req.convention, r), layout)
        gpu_params = max(g.split.total for g in groups)
        rows = req.global_batch // layout.dp
        micro = sorted(b for b in (req.micro_batches or divisors(rows)) if rows % b == 0)
        micro = [b for b in micro if _valid_accumulation(layout, rows // b)]
        if not micro:
            return
        offloads = [(False, False)] + ([(True, False), (True, True)] if req.allow_offload else [])
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
            for off_opt, off_par in offloads:
                if off_par and zero != 3:
                    continue
                for part, accum in parts:
                    update: dict[str, object] = {
                        "zero_stage": zero,
                        "offload_optimizer": off_opt,
                        "offload_params": off_par,
                    }
                    if accum is not None:
                        update["grad_accum"] = accum
                    knobs = req.training.model_copy(update=update)
                    self._configs(layout, groups, knobs, part, rows, gpu_params)

    def _configs(
        self,
        layout: Layout,
        groups: list[PreparedDevice],
        knobs: Training,
        micro: list[int],
        rows: int,
        gpu_params: int,
    ) -> None:
        """Every (recompute, micro-batch) of one (ZeRO, offload) choice."""
        zero, off_opt, off_par = knobs.zero_stage, knobs.offload_optimizer, knobs.offload_params
        deepest = max(self.levels, key=RECOMPUTE_LEVELS.index)
        rows_st = self._rows(layout, groups, knobs, micro)
        # Probe the least memory-hungry config (most recompute, smallest micro-batch):
        # every other one of this (ZeRO, offload) needs at least as much, so if it does
        # not fit none does, and all are decided exactly without being swept.
        before, gpu_fits, limited = len(self.fitting), self.gpu_fits, self.host_limited
        args = (rows, gpu_params)
        self._sweep(layout, rows_st, zero, off_opt, off_par, deepest, micro[:1], *args)
        if self.gpu_fits == gpu_fits:
            self.evaluated += len(self.levels) * len(micro) - 1
            return
        del self.fitting[before:]  # the sweeps below evaluate it again
        self.gpu_fits, self.host_limited = gpu_fits, limited
        self.evaluated -= 1
        for rc in self.levels:
            self._sweep(layout, rows_st, zero, off_opt, off_par, rc, micro, *args)

    def _sweep(
        self,
        layout: Layout,
        rows_st: list[_Row],
        zero: int,
        off_opt: bool,
        off_par: bool,
        rc: Recompute,
        micro: list[int],
        rows: int,
        gpu_params: int,
    ) -> None:
        """All micro-batch sizes for one (ZeRO, offload, recompute): the hot loop."""
        if rows_st[0].traced is not None:  # a traced profile: the replay, not linear terms
            self._traced_sweep(layout, rows_st, zero, off_opt, off_par, rc, micro, rows, gpu_params)
            return
        r, ov = self.r, self.ov
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
        req = self.req
        curve = cost_curve(
            req.cost,
            layout.pp,
            layout.vpp,
            layout.dp,
            layout.world_size,
            req.training.seq_len,
            rc,
            zero,
            off_opt,
            off_par,
            self.active,
            gpu_params,
            req.global_batch,
            r.precision.weights,
            r.precision.gradients,
        )
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
                seconds = sum(cost_at(curve, b, m, row.shard))
                fitting.append(
                    (seconds, total, layout, key, row.stage, phase, m, row.shard, gpu_params, host)
                )
                continue
            if self.closest is None or total < self.closest[1]:
                self.closest = (
                    0.0, total, layout, key, row.stage, phase, m, row.shard, gpu_params, host
                )  # fmt: skip
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
        zero: int,
        off_opt: bool,
        off_par: bool,
        rc: Recompute,
        micro: list[int],
        rows: int,
        gpu_params: int,
    ) -> None:
        """``_sweep`` for a traced profile: each device's peak from its replay, exactly as
        ``estimate`` computes it; slower than the linear loop, the same answers."""
        r, ov, req = self.r, self.ov, self.req
        curve = cost_curve(
            req.cost, layout.pp, layout.vpp, layout.dp, layout.world_size, req.training.seq_len,
            rc, zero, off_opt, off_par, self.active, gpu_params, req.global_batch,
            r.precision.weights, r.precision.gradients,
        )  # fmt: skip
        host_1, host_m = self._host
        for b in micro:
            m = rows // b
            best, row, fb_best, opt_best = -1, rows_st[0], 0, 0
            for g in rows_st:
                assert g.traced is not None and g.device is not None  # every traced row has them
                ts = g.traced[rc]
                fb = (
                    g.base_fb + ts.forward_backward(b, traced_in_flight(g.device, layout, rc, m))[0]
                )
                opt = g.opt + ts.batch(b)
                if max(fb, opt) > best:
                    best, row, fb_best, opt_best = max(fb, opt), g, fb, opt
            total = best + math.ceil(best * r.fragmentation) + r.cuda_context_bytes
            total += ov.calibration_bytes
            phase = "forward-backward" if fb_best >= opt_best else "optimizer-step"
            key = (zero, b, off_opt, off_par, rc)
            host = host_1 if m == 1 else host_m
            hit = (0.0, total, layout, key, row.stage, phase, m, row.shard, gpu_params, host)
            self.evaluated += 1
            if total > self.budget:
                if self.closest is None or total < self.closest[1]:
                    self.closest = hit
                continue
            self.gpu_fits += 1
            if host > self.host_budget:
                self.host_limited += 1
                if self.host_limited_bytes is None or host < self.host_limited_bytes:
                    self.host_limited_bytes = host
                continue
            self.fitting.append((sum(cost_at(curve, b, m, row.shard)), *hit[1:]))

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
            if sched == "dualpipe" and pp > 1:  # fixed counts: PP - j for each held stage j
                acts = {rc: device_in_flight(g, layout, rc, 2 * pp)[0] for rc in RECOMPUTE_LEVELS}
                fixed = 1
            elif sched == "interleaved" and pp > 1:
                table = {
                    rc: {rows // b: device_in_flight(g, layout, rc, rows // b)[0] for b in micro}
                    for rc in self.levels
                }
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
        _, total, layout, key, stage, phase, m, shard, gpu_params, host = hit
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
        cost = step_cost(
            self.req.cost,
            layout,
            t,
            self.active,
            gpu_params,
            shard,
            self.req.global_batch,
            self.r.precision.weights,
            self.r.precision.gradients,
        )
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
            host_bytes_per_node=host,
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
    """Every config in the search space that fits, ranked by the cost model (``cost.py``)."""
    prof = req.training.implementation
    if isinstance(prof, TracedProfile):
        model, _ = without_untraced_mtp(req.model, prof)
        check_profile(prof, model_total(model, "megatron"), next(iter(prof.levels)))
        req = req.model_copy(update={"model": model})
    search = _Search(req)
    for layout in _layouts(req):
        if req.global_batch % layout.dp == 0:
            search.layout(layout)
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
        host_limited=search.host_limited,
        host_limited_bytes=search.host_limited_bytes,
    )
