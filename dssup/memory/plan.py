"""Find the configs that fit a GPU, cheapest first, with the global batch exact.

The search varies micro-batch (with the matching gradient accumulation, so that
micro x accumulation x DP = global batch always), recompute level, ZeRO stage, offload and,
on request, TP/PP/EP. It is fast because activations are linear in the micro-batch: each
layout's per-sample activation bytes and model states are computed once, and every
(recompute, ZeRO, offload, micro-batch) combination is then a few multiplications per stage
using exactly the arithmetic of ``estimate`` (so a planned config re-estimates to the same bytes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dssup.errors import ConfigError
from dssup.memory.config import RECOMPUTE_LEVELS, Convention, Layout, Overheads, Recompute, Training
from dssup.memory.core import PreparedStage, prepare, states
from dssup.memory.cost import CostModel, cost_at, cost_curve, step_cost
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.params import model_total
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import (
    TracedStage,
    check_profile,
    traced_stage,
    without_untraced_mtp,
)
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


class PlanResult(BaseModel):
    model_config = _FROZEN
    candidates: list[Candidate] = Field(description="configs that fit, cheapest first")
    evaluated: int = Field(description="configs whose memory was computed")
    fitting: int = Field(description="configs that fit (before the limit)")
    closest: Candidate | None = Field(description="smallest peak among those that do not fit")


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


def _groups(stages: list[PreparedStage]) -> list[PreparedStage]:
    """One stage per kind: stages with equal parameters and activations peak at the lowest
    index (it holds the most in-flight micro-batches), so only that one can be the peak."""
    seen: dict[tuple[object, ...], PreparedStage] = {}
    for st in stages:
        key = (st.params.split, tuple(sorted(st.acts.items())), st.params.largest_layer)
        seen.setdefault(key, st)
    return list(seen.values())


def _active_params(m: ModelSpec) -> int:
    total = model_total(m, "megatron")
    if m.moe is None:
        return total
    inactive = (m.moe.n_routed - m.moe.top_k) * 3 * m.hidden * m.moe.expert_ffn
    return total - inactive * m.moe_layer_count


_Key = tuple[int, int, bool, bool, Recompute]
_Hit = tuple[float, int, Layout, _Key, int, str, int, int, int]


class _Row(NamedTuple):
    """One stage kind under one (ZeRO, offload) choice: what the inner loop reads."""

    stage: int
    depth: int  # pp - index: 1F1B in-flight bound
    fixed: int  # in-flight count independent of m (pp == 1, DualPipe); 0 = use depth/m
    factor: float
    acts: dict[Recompute, int]
    base_fb: int
    opt: int
    shard: int
    tail: dict[Recompute, int] | None  # eager end of backward: per-sample bytes by level
    tail_base: int  # eager end of backward: batch-independent bytes (with static, buffers)
    traced: dict[Recompute, TracedStage] | None = None  # traced profile: replay by level


def _tail(row: _Row, rc: Recompute) -> tuple[int, int]:
    """(per-sample, batch-independent) end-of-backward bytes of ``row``; (0, -1) without."""
    return (row.tail[rc], row.tail_base) if row.tail is not None else (0, -1)


def _levels(req: PlanRequest) -> tuple[Recompute, ...]:
    """Recompute levels to plan: a traced profile's own (a level it lacks is not planned)."""
    prof = req.training.implementation
    if not isinstance(prof, TracedProfile):
        return req.recompute
    levels = tuple(rc for rc in req.recompute if rc in prof.levels)
    if not levels:
        raise ConfigError(
            "--recompute",
            f"none of {', '.join(req.recompute)} is in the profile (traced: "
            f"{', '.join(prof.levels)})",
            "plan the levels the profile holds, or calibrate them",
        )
    return levels


class _Search:
    """The inner loop: integer arithmetic only, identical to ``estimate``'s."""

    def __init__(self, req: PlanRequest) -> None:
        self.req = req
        self.ov = req.overheads or Overheads()
        self.r: Resolved = resolve(req.convention, req.training, self.ov)
        self.budget = int(req.gpu_memory_bytes * (1.0 - req.margin))
        self.active = _active_params(req.model)
        self.evaluated = 0
        self.levels = _levels(req)
        self.fitting: list[_Hit] = []
        self.closest: _Hit | None = None

    def layout(self, layout: Layout) -> None:
        req, r = self.req, self.r
        try:
            validate(req.model, layout, req.training)
        except ConfigError:
            if req.search_parallelism:
                return
            raise
        groups = _groups(prepare(req.model, layout, req.training, req.convention, r))
        gpu_params = max(g.params.split.total for g in groups)
        rows = req.global_batch // layout.dp
        micro = sorted(b for b in (req.micro_batches or divisors(rows)) if rows % b == 0)
        offloads = [(False, False)] + ([(True, False), (True, True)] if req.allow_offload else [])
        deepest = max(self.levels, key=RECOMPUTE_LEVELS.index)
        for zero in req.zero_stages:
            for off_opt, off_par in offloads:
                if off_par and zero != 3:
                    continue
                knobs = req.training.model_copy(
                    update={
                        "zero_stage": zero,
                        "offload_optimizer": off_opt,
                        "offload_params": off_par,
                    }
                )
                rows_st = self._rows(layout, groups, knobs)
                # Probe the least memory-hungry config (most recompute, smallest micro-batch):
                # every other one of this (ZeRO, offload) needs at least as much, so if it does
                # not fit none does, and all are decided exactly without being swept.
                before = len(self.fitting)
                args = (rows, gpu_params)
                self._sweep(layout, rows_st, zero, off_opt, off_par, deepest, micro[:1], *args)
                if len(self.fitting) == before:
                    self.evaluated += len(self.levels) * len(micro) - 1
                    continue
                del self.fitting[before:]  # the sweeps below evaluate it again
                self.evaluated -= 1
                for rc in self.levels:
                    self._sweep(
                        layout, rows_st, zero, off_opt, off_par, rc, micro, rows, gpu_params
                    )

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
        r, ov = self.r, self.ov
        frag, extra, budget = (
            r.fragmentation,
            r.cuda_context_bytes + ov.calibration_bytes,
            self.budget,
        )
        # Without an eager end-of-backward term its bytes are -1: never above the peak.
        table = [
            (g, g.fixed, g.depth, g.acts[rc] * g.factor, g.base_fb, g.opt, *_tail(g, rc))
            for g in rows_st
        ]
        if rows_st[0].traced is not None:  # a traced profile: the replay, not the linear terms
            if rc in rows_st[0].traced:
                self._traced_sweep(
                    layout, rows_st, zero, off_opt, off_par, rc, micro, rows, gpu_params
                )
            return
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
        i = -1
        for i, b in enumerate(micro):
            m = rows // b
            best, row, fb_best = -1, rows_st[0], 0
            for g, fixed, depth, a, base_fb, opt, tail_a, tail_base in table:
                fb = max(  # the eager end of backward can top the start of backward
                    base_fb + math.ceil(a * b * (fixed or (depth if depth < m else m))),
                    tail_base + tail_a * b,
                )
                alloc = fb if fb >= opt else opt
                if alloc > best:
                    best, row, fb_best = alloc, g, fb
            total = best + math.ceil(best * frag) + extra
            phase = "forward-backward" if fb_best >= row.opt else "optimizer-step"
            key = (zero, b, off_opt, off_par, rc)
            if total <= budget:
                seconds = sum(cost_at(curve, b, m, row.shard))
                fitting.append(
                    (seconds, total, layout, key, row.stage, phase, m, row.shard, gpu_params)
                )
                continue
            if self.closest is None or total < self.closest[1]:
                self.closest = (0.0, total, layout, key, row.stage, phase, m, row.shard, gpu_params)
            # The peak only grows with b (a * b * min(PP - i, rows / b) = a * min(b * (PP - i),
            # rows)), so every larger micro-batch is decided too: it does not fit either.
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
        """``_sweep`` for a traced profile: each stage's peak from ``TracedStage`` (as in
        ``estimate``); slower than the linear loop, same answers."""
        r, ov, req = self.r, self.ov, self.req
        curve = cost_curve(
            req.cost, layout.pp, layout.vpp, layout.dp, layout.world_size, req.training.seq_len,
            rc, zero, off_opt, off_par, self.active, gpu_params, req.global_batch,
            r.precision.weights, r.precision.gradients,
        )  # fmt: skip
        for b in micro:
            m = rows // b
            best, row, fb_best, opt_best = -1, rows_st[0], 0, 0
            for g in rows_st:
                assert g.traced is not None  # every row of a traced request has it
                ts = g.traced[rc]
                count = g.fixed or (g.depth if g.depth < m else m)
                fb = g.base_fb + ts.forward_backward(b, math.ceil(count * g.factor))[0]
                opt = g.opt + ts.batch(b)
                if max(fb, opt) > best:
                    best, row, fb_best, opt_best = max(fb, opt), g, fb, opt
            total = best + math.ceil(best * r.fragmentation) + r.cuda_context_bytes
            total += ov.calibration_bytes
            phase = "forward-backward" if fb_best >= opt_best else "optimizer-step"
            hit = (0.0, total, layout, (zero, b, off_opt, off_par, rc), row.stage, phase, m,
                   row.shard, gpu_params)  # fmt: skip
            self.evaluated += 1
            if total <= self.budget:
                seconds = sum(cost_at(curve, b, m, row.shard))
                self.fitting.append((seconds, *hit[1:]))
            elif self.closest is None or total < self.closest[1]:
                self.closest = hit

    def _rows(self, layout: Layout, groups: list[PreparedStage], knobs: Training) -> list[_Row]:
        out = []
        pp, sched = layout.pp, layout.schedule
        factor = 1.0 + (pp - 1) / (pp * layout.vpp) if sched == "interleaved" else 1.0
        fixed = 1 if pp == 1 else (pp + 1 if sched == "dualpipe" else 0)
        for g in groups:
            s = states(g, layout, knobs, self.req.convention, self.r, self.ov)
            traced = None
            if isinstance(knobs.implementation, TracedProfile):
                sp, prof = g.params, knobs.implementation
                traced = {
                    rc: traced_stage(
                        prof,
                        layout,
                        knobs.model_copy(update={"recompute": rc}),
                        sp.dense_layers,
                        sp.moe_layers,
                        sp.first,
                        sp.last,
                        s.ms.gradients,
                    )
                    for rc in self.levels
                }
            out.append(
                _Row(
                    g.index,
                    pp - g.index,
                    fixed,
                    factor,
                    g.acts,
                    s.static + s.working_set + self.r.comm_buffer_bytes,
                    s.static + s.transient,
                    s.ms.shard_params,
                    g.tail if s.tail is not None else None,
                    s.static + (s.tail or 0) + self.r.comm_buffer_bytes,
                    traced,
                )
            )
        return out

    def candidate(self, hit: _Hit) -> Candidate:
        _, total, layout, key, stage, phase, m, shard, gpu_params = hit
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
        )


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
        candidates=chosen, evaluated=search.evaluated, fitting=len(search.fitting), closest=closest
    )
