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

from pydantic import BaseModel, ConfigDict, Field

from dssup.errors import ConfigError
from dssup.memory.activations import keep
from dssup.memory.config import RECOMPUTE_LEVELS, Convention, Layout, Overheads, Recompute, Training
from dssup.memory.cost import CostModel, step_cost
from dssup.memory.defaults import Resolved, resolve
from dssup.memory.estimate import in_flight, make_ctx, stage_activation_terms
from dssup.memory.spec import ModelSpec
from dssup.memory.stages import StageParams, partition, stage_params
from dssup.memory.validate import divisors, validate
from dssup.memory.zero import model_states

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


class _Stage:
    __slots__ = ("acts", "count", "params", "pp_index")

    def __init__(self, params: StageParams, acts: dict[Recompute, int], pp_index: int) -> None:
        self.params, self.acts, self.pp_index = params, acts, pp_index
        self.count = 0


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


def _prepare(req: PlanRequest, layout: Layout, r: Resolved) -> list[_Stage] | None:
    m, conv = req.model, req.convention
    try:
        validate(m, layout, req.training)
    except ConfigError:
        if req.search_parallelism:
            return None
        raise
    c = make_ctx(m, layout, req.training, conv, r)
    out = []
    for i, layers in enumerate(partition(m.layers, layout)):
        sp = stage_params(m, layout, conv, layers, i)
        terms = stage_activation_terms(c, m, layers, sp)
        acts = {rc: sum(t.bytes for t in terms if keep(t.group, rc)) for rc in req.recompute}
        out.append(_Stage(sp, acts, i))
    return out


def _candidate_trainings(req: PlanRequest, layout: Layout) -> Iterator[Training]:
    rows = req.global_batch // layout.dp
    micro = req.micro_batches or tuple(divisors(rows))
    offloads = [(False, False)] + ([(True, False), (True, True)] if req.allow_offload else [])
    for zero in req.zero_stages:
        for off_opt, off_par in offloads:
            if off_par and zero != 3:
                continue
            for rc in req.recompute:
                for b in micro:
                    if rows % b == 0:
                        yield req.training.model_copy(
                            update={
                                "micro_batch": b,
                                "grad_accum": rows // b,
                                "recompute": rc,
                                "zero_stage": zero,
                                "offload_optimizer": off_opt,
                                "offload_params": off_par,
                            }
                        )


def _peak(
    req: PlanRequest,
    layout: Layout,
    stages: list[_Stage],
    t: Training,
    r: Resolved,
    ov: Overheads,
) -> tuple[int, int, str, int]:
    """(peak bytes, peak stage, phase, shard params of the peak stage) — estimate's arithmetic."""
    dp_shard = layout.dp * (layout.cp if req.convention == "megatron" else 1)
    best = (-1, 0, "", 0)
    for st in stages:
        split = st.params.split.scale(2) if layout.schedule == "dualpipe" else st.params.split
        ms = model_states(
            split.non_moe,
            split.moe,
            dp_shard,
            layout.edp,
            t.zero_stage,
            r.precision,
            t.offload_optimizer,
            t.offload_params,
        )
        count, factor = in_flight(layout, st.pp_index, t.grad_accum)
        acts = math.ceil(st.acts[t.recompute] * t.micro_batch * count * factor)
        ws = 0
        if t.zero_stage == 3:
            live = min(
                ov.zero3_max_live_parameters, st.params.largest_layer + ov.zero3_prefetch_bucket
            )
            ws = r.precision.weights * live
        static = ms.weights + ms.gradients + ms.optimizer
        fb = static + acts + ws + r.comm_buffer_bytes
        transient = 0 if t.offload_optimizer else r.optimizer_transient_per_param * ms.shard_params
        opt = static + transient
        alloc = max(fb, opt)
        total = (
            alloc + math.ceil(alloc * r.fragmentation) + r.cuda_context_bytes + ov.calibration_bytes
        )
        if total > best[0]:
            phase = "forward-backward" if fb >= opt else "optimizer-step"
            best = (total, st.pp_index, phase, ms.shard_params)
    return best


def _active_params(m: ModelSpec) -> int:
    from dssup.memory.params import model_total

    total = model_total(m, "megatron")
    if m.moe is None:
        return total
    inactive = (m.moe.n_routed - m.moe.top_k) * 3 * m.hidden * m.moe.expert_ffn
    return total - inactive * m.moe_layer_count


def plan(req: PlanRequest) -> PlanResult:
    """Every config in the search space that fits, ranked by ``cost.step_cost``."""
    ov = req.overheads or Overheads()
    r = resolve(req.convention, req.training, ov)
    budget = int(req.gpu_memory_bytes * (1.0 - req.margin))
    active = _active_params(req.model)
    fitting: list[Candidate] = []
    closest: Candidate | None = None
    evaluated = 0
    for layout in _layouts(req):
        if req.global_batch % layout.dp:
            continue
        stages = _prepare(req, layout, r)
        if stages is None:
            continue
        gpu_params = max(s.params.split.total for s in stages)
        for t in _candidate_trainings(req, layout):
            evaluated += 1
            peak, stage, phase, shard = _peak(req, layout, stages, t, r, ov)
            fits = peak <= budget
            if not fits and closest is not None and peak >= closest.peak_bytes:
                continue
            cost = step_cost(
                req.cost,
                layout,
                t,
                active,
                gpu_params,
                shard,
                req.global_batch,
                r.precision.weights,
                r.precision.gradients,
            )
            cand = Candidate(
                layout=layout,
                training=t,
                peak_bytes=peak,
                peak_stage=stage,
                phase=phase,
                fits=fits,
                headroom_bytes=req.gpu_memory_bytes - peak,
                step_time_s=cost["total"],
                cost_terms=cost,
            )
            if fits:
                fitting.append(cand)
            else:
                closest = cand
    fitting.sort(key=lambda c: (c.step_time_s, -c.headroom_bytes))
    return PlanResult(
        candidates=fitting[: req.limit],
        evaluated=evaluated,
        fitting=len(fitting),
        closest=None if fitting else closest,
    )
