"""The arithmetic shared by ``estimate`` and ``plan``, so both always agree to the byte.

A pipeline stage is prepared once per layout: its parameters and its per-sample activation
terms depend only on which layers it holds (stages with the same kind of layers share the
work). Everything that varies per config -- micro-batch, accumulation, recompute, ZeRO,
offload -- is then a handful of integer operations in ``alloc``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dssup.memory.activations import Ctx, Term, keep, layer_terms, stage_io_terms
from dssup.memory.config import RECOMPUTE_LEVELS, Convention, Layout, Overheads, Recompute, Training
from dssup.memory.defaults import Resolved
from dssup.memory.params import Split
from dssup.memory.profile import EagerProfile, eager_constant, eager_tail, eager_terms
from dssup.memory.spec import ModelSpec
from dssup.memory.stages import StageParams, padded_vocab, partition, stage_params
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import stored_terms
from dssup.memory.zero import ModelStates, model_states

__all__ = [
    "PreparedStage",
    "States",
    "device_split",
    "end_of_backward",
    "in_flight",
    "make_ctx",
    "prepare",
    "states",
]


def make_ctx(
    m: ModelSpec, layout: Layout, training: Training, conv: Convention, r: Resolved
) -> Ctx:
    return Ctx(
        m=m,
        conv=conv,
        t=layout.tp,
        seq=layout.tp if layout.sp else 1,
        s=training.seq_len // layout.cp,
        s_full=training.seq_len,
        flash=r.flash,
        dropout=r.dropout,
        ep=layout.ep,
        etp=layout.etp,
        imbalance=training.moe_imbalance,
        vocab=padded_vocab(m, layout.tp, conv),
        profile=training.implementation,
    )


def in_flight(layout: Layout, stage: int, grad_accum: int) -> tuple[int, float]:
    """Micro-batches whose activations are alive at the peak of ``stage``, and the interleaving
    factor (1F1B: min(PP - i, m); interleaved: x (1 + (PP-1)/(PP*VPP)); DualPipe: PP + 1)."""
    pp = layout.pp
    if pp == 1:
        return 1, 1.0
    if layout.schedule == "dualpipe":
        return pp + 1, 1.0
    count = min(pp - stage, grad_accum)
    if layout.schedule == "interleaved":
        return count, 1.0 + (pp - 1) / (pp * layout.vpp)
    return count, 1.0


@dataclass(frozen=True, slots=True)
class PreparedStage:
    """A stage with everything that does not depend on the per-config knobs."""

    index: int
    layers: range
    params: StageParams
    terms: tuple[Term, ...]  # per sample, every group
    acts: dict[Recompute, int]  # kept per-sample bytes by recompute level
    tail: dict[Recompute, int] | None  # eager end-of-backward per-sample bytes by level


def _terms(c: Ctx, m: ModelSpec, sp: StageParams) -> tuple[Term, ...]:
    if isinstance(c.profile, TracedProfile):  # traced: what the blocks keep (for the report)
        found = stored_terms(c.profile, sp.dense_layers, sp.moe_layers, c.s, c.s_full, c.t)
        return tuple(Term(name, group, b) for name, group, b in found)
    if c.profile is not None:  # eager: measured per layer kind and recompute level
        edge = sp.first or sp.last
        found = eager_terms(c.profile, sp.dense_layers, sp.moe_layers, edge, c.s, c.t)
        return tuple(Term(name, group, b) for name, group, b in found)
    sums: dict[tuple[str, str], int] = {}
    for moe_layer, count in ((True, sp.moe_layers), (False, sp.dense_layers)):
        if count:
            for t in layer_terms(c, moe_layer):
                sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes * count
    mtp = layer_terms(c, m.moe is not None) if (sp.last and m.mtp_depth) else []
    for t in stage_io_terms(c, sp.first, sp.last, mtp):
        sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes
    return tuple(Term(name, group, b) for (name, group), b in sums.items())


def prepare(
    m: ModelSpec, layout: Layout, training: Training, conv: Convention, r: Resolved
) -> list[PreparedStage]:
    """Parameters and activation terms of every stage of ``layout``."""
    c = make_ctx(m, layout, training, conv, r)
    out = []
    for i, layers in enumerate(partition(m.layers, layout)):
        sp = stage_params(m, layout, conv, layers, i)
        terms, acts = _stage_terms(c, sp)
        out.append(PreparedStage(i, layers, sp, terms, acts, _tail(c)))
    return out


def _tail(c: Ctx) -> dict[Recompute, int] | None:
    """Per-sample end-of-backward bytes of an eager profile that has the term."""
    if not isinstance(c.profile, EagerProfile):
        return None
    found = {rc: eager_tail(c.profile, rc, c.s, c.t) for rc in RECOMPUTE_LEVELS}
    return {rc: v[0] for rc, v in found.items() if v is not None} or None


@lru_cache(maxsize=4096)
def _stage_terms(c: Ctx, sp: StageParams) -> tuple[tuple[Term, ...], dict[Recompute, int]]:
    """Terms of a stage and its kept bytes per recompute level (cached: the planner meets the
    same stage kinds in many layouts). Callers must not mutate the returned dict."""
    terms = _terms(c, c.m, sp)
    acts = {rc: sum(t.bytes for t in terms if keep(t.group, rc)) for rc in RECOMPUTE_LEVELS}
    return terms, acts


def device_split(st: PreparedStage, layout: Layout) -> Split:
    """Parameters one GPU holds for ``st``: DualPipe keeps two stages' worth (both directions)."""
    return st.params.split.scale(2) if layout.schedule == "dualpipe" else st.params.split


@dataclass(frozen=True, slots=True)
class States:
    """Config-dependent, micro-batch-independent bytes of one stage."""

    ms: ModelStates
    static: int  # weights + gradients + optimizer on the device
    working_set: int  # ZeRO-3 gathered parameters
    transient: int  # optimizer-step temporaries
    host: int
    tail: int | None = None  # eager end of backward over ``static``, less its per-sample bytes


def states(
    st: PreparedStage, layout: Layout, t: Training, conv: Convention, r: Resolved, ov: Overheads
) -> States:
    split = device_split(st, layout)
    dp_shard = layout.dp * (layout.cp if conv == "megatron" else 1)
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
    ws = 0
    if t.zero_stage == 3:
        live = min(ov.zero3_max_live_parameters, st.params.largest_layer + ov.zero3_prefetch_bucket)
        ws = r.precision.weights * live
    if isinstance(t.implementation, TracedProfile):
        return _traced_states(t, ms, ws)
    if t.implementation is not None:
        return _eager_states(st, t, ms, ws)
    transient = r.optimizer_transient_per_param * ms.shard_params
    host = ms.host + (transient if t.offload_optimizer else 0)
    if t.offload_optimizer:
        transient = 0
    return States(ms, ms.weights + ms.gradients + ms.optimizer, ws, transient, host)


def _traced_states(t: Training, ms: ModelStates, ws: int) -> States:
    """Traced profile: like eager, gradients exist from backward to the optimizer step only
    (unless accumulating); the replay adds everything else (``traced_stage``)."""
    p = t.implementation
    assert isinstance(p, TracedProfile)  # checked by the caller; not input validation
    grads_fb = ms.gradients if t.grad_accum > 1 else 0
    opt_tmp = math.ceil(p.optimizer_transient_per_param * ms.shard_params)
    host = ms.host + (opt_tmp if t.offload_optimizer else 0)
    if t.offload_optimizer:
        opt_tmp = 0
    static = ms.weights + ms.optimizer + grads_fb
    return States(ms, static, ws, ms.gradients - grads_fb + opt_tmp, host)


def _eager_states(st: PreparedStage, t: Training, ms: ModelStates, ws: int) -> States:
    """Eager PyTorch: gradients exist only from backward to the optimizer step (unless
    accumulating), so in forward/backward they are not part of ``static``; they and the
    optimizer temporaries make up the optimizer-step transient. Batch-independent saved bytes
    (autocast weight copies, the head gradient at the backward peak) join the working set."""
    p = t.implementation
    assert isinstance(p, EagerProfile)  # checked by the caller; not input validation
    grads_fb = 0 if (p.grads_freed_between_steps and t.grad_accum == 1) else ms.gradients
    edge = st.params.first or st.params.last
    sp = st.params
    zero3_ws = ws
    ws += eager_constant(p, sp.dense_layers, sp.moe_layers, edge, t.recompute)
    opt_tmp = math.ceil(p.optimizer_transient_per_param * ms.shard_params)
    host = ms.host + (opt_tmp if t.offload_optimizer else 0)
    if t.offload_optimizer:
        opt_tmp = 0
    static = ms.weights + ms.optimizer + grads_fb
    found = eager_tail(p, t.recompute, t.seq_len, 1)
    tail = None if found is None else zero3_ws + ms.gradients - grads_fb + found[1]
    return States(ms, static, ws, ms.gradients - grads_fb + opt_tmp, host, tail)


def end_of_backward(st: PreparedStage, s: States, t: Training, buffers: int) -> int | None:
    """Eager end-of-backward peak (every gradient plus the first block's and the embedding's
    backward), or None without such a term. It is part of the forward-backward phase."""
    if s.tail is None or st.tail is None:
        return None
    return s.static + s.tail + st.tail[t.recompute] * t.micro_batch + buffers


def activations(per_sample: int, micro_batch: int, count: int, factor: float) -> tuple[int, int]:
    """(per-micro-batch bytes, in-flight bytes)."""
    per_mb = per_sample * micro_batch
    return per_mb, math.ceil(per_mb * count * factor)


def finish(alloc: int, r: Resolved, ov: Overheads) -> tuple[int, int]:
    """(fragmentation bytes, device total) from the allocator peak."""
    frag = math.ceil(alloc * r.fragmentation)
    return frag, alloc + frag + r.cuda_context_bytes + ov.calibration_bytes
