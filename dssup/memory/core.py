"""The arithmetic shared by ``estimate`` and ``plan``, so both always agree to the byte.

A pipeline stage is prepared once per layout: its parameters and its per-sample activation
terms depend only on which layers it holds (stages with the same kind of layers share the
work). A device (pipeline rank) holds one or more stages (``stages.placement``): its model
states are those of all its stages, its activations the in-flight micro-batches of each stage
at the device's peak (``schedule.py``). Everything that varies per config -- micro-batch,
accumulation, recompute, ZeRO, offload -- is then a handful of integer operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dssup.memory.activations import FULL_KEEP, Ctx, Term, keep, layer_terms, stage_io_terms
from dssup.memory.backward import layer_temporaries, loss_backward, recomputed_unit
from dssup.memory.config import RECOMPUTE_LEVELS, Convention, Layout, Recompute, Training
from dssup.memory.defaults import Resolved
from dssup.memory.moments import Moment, eager_moments
from dssup.memory.params import Split
from dssup.memory.profile import EagerProfile, eager_tail, eager_terms
from dssup.memory.schedule import held_counts, interleaved_states
from dssup.memory.spec import ModelSpec
from dssup.memory.stages import (
    StageParams,
    padded_vocab,
    partition,
    placement,
    stage_params,
)
from dssup.memory.states import States, constant, finish, states, tails, zero3_working_set
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import stored_terms

__all__ = [
    "PreparedDevice",
    "PreparedStage",
    "States",
    "constant",
    "device_in_flight",
    "finish",
    "make_ctx",
    "prepare",
    "states",
    "tails",
    "zero3_working_set",
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
        vocab=padded_vocab(m, layout.tp, conv, r.framework in ("megatron", "deepseek")),
        profile=training.implementation,
        r=r,
    )


@dataclass(frozen=True, slots=True)
class PreparedStage:
    """A (virtual) stage with everything that does not depend on the per-config knobs."""

    index: int
    layers: range
    params: StageParams
    terms: dict[Recompute, tuple[Term, ...]]  # kept per-sample terms by recompute level
    acts: dict[Recompute, int]  # kept per-sample bytes by recompute level
    work: dict[Recompute, int]  # per-sample backward working set of one micro-batch, by level
    tail: dict[Recompute, int] | None  # eager end-of-backward per-sample bytes by level
    const: dict[Recompute, int] | None = None  # batch-independent saved bytes (autocast)
    moments: tuple[Moment, ...] = ()  # other peaks of eager frameworks (``moments.py``)


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One pipeline rank: the stages it holds and the parameters of all of them."""

    index: int
    stages: tuple[PreparedStage, ...]
    split: Split
    largest_layer: int
    works: dict[Recompute, int]  # one backward at a time: the largest working set held
    consts: dict[Recompute, int]  # batch-independent saved bytes (autocast copies)

    @property
    def layers(self) -> list[int]:
        return sorted(i for st in self.stages for i in st.layers)

    @property
    def edge(self) -> bool:
        """Holds the embedding or the head (eager profiles' stage term)."""
        return any(st.params.first or st.params.last for st in self.stages)

    @property
    def tail(self) -> dict[Recompute, int] | None:
        return self.stages[0].tail

    def work(self, rc: Recompute) -> int:
        """One backward runs at a time: the largest working set among the held stages."""
        return self.works[rc]


def _eager_profile_terms(c: Ctx, sp: StageParams) -> dict[Recompute, tuple[Term, ...]]:
    """An eager profile: terms measured per layer kind and recompute level; a traced one: what
    the blocks keep from forward to backward (for the report; its peak is replayed)."""
    assert c.profile is not None  # checked by the caller; not input validation
    if isinstance(c.profile, TracedProfile):
        dense, moe = sp.dense_layers, sp.moe_layers
        found = stored_terms(c.profile, dense, moe, c.s, c.s_full, c.seq)
    else:
        edge = sp.first or sp.last
        found = eager_terms(c.profile, sp.dense_layers, sp.moe_layers, edge, c.s, c.t)
    terms = tuple(Term(name, group, b) for name, group, b in found)
    return {rc: tuple(t for t in terms if keep(t.group, rc, c)) for rc in RECOMPUTE_LEVELS}


def _kept_full(c: Ctx, kinds: tuple[bool, ...], per: dict[bool, list[Term]]) -> list[Term]:
    """Layer terms kept under full recompute: Megatron's uniform method checkpoints the input of
    every unit of ``recompute_num_layers`` layers, block the first that many layers of the
    stage and keeps the rest whole; the paper and eager frameworks checkpoint every layer."""
    r = c.r
    if r is None or c.conv == "paper" or c.eager:
        method, n = "uniform", 1
    else:
        method, n = r.recompute_method, r.recompute_num_layers
    if method == "uniform" and n == 1:
        return [t for t in _every(kinds, per) if t.group in FULL_KEEP]
    out: list[Term] = []
    for j, moe in enumerate(kinds):
        if method == "block" and j >= n:
            out += per[moe]
        elif method == "block" or j % n == 0:
            out += [t for t in per[moe] if t.group in FULL_KEEP]
    return out


def _every(kinds: tuple[bool, ...], per: dict[bool, list[Term]]) -> list[Term]:
    """Every layer's terms, MoE layers first (the order the names are reported in)."""
    return [t for moe in (True, False) for _ in range(kinds.count(moe)) for t in per[moe]]


def _sum_counted(layers: list[tuple[Term, int]], rest: list[Term]) -> tuple[Term, ...]:
    """``_sum`` of every layer's terms (each ``n`` times) then ``rest``, in that order."""
    sums: dict[tuple[str, str], int] = {}
    for t, n in layers:
        sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes * n
    for t in rest:
        sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes
    return tuple(Term(name, group, b) for (name, group), b in sums.items())


def _sum(terms: list[Term]) -> tuple[Term, ...]:
    sums: dict[tuple[str, str], int] = {}
    for t in terms:
        sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes
    return tuple(Term(name, group, b) for (name, group), b in sums.items())


@lru_cache(maxsize=4096)
def _stage_terms(
    c: Ctx, sp: StageParams, kinds: tuple[bool, ...]
) -> tuple[dict[Recompute, tuple[Term, ...]], dict[Recompute, int], dict[Recompute, int]]:
    """Kept terms, kept bytes and the backward working set of a stage per recompute level
    (cached: the planner meets the same stage kinds in many layouts). Callers must not mutate
    the returned dicts."""
    if c.profile is not None:
        terms = _eager_profile_terms(c, sp)
        zero = dict.fromkeys(RECOMPUTE_LEVELS, 0)
        return terms, {rc: sum(t.bytes for t in terms[rc]) for rc in RECOMPUTE_LEVELS}, zero
    per = {moe: layer_terms(c, moe) for moe in set(kinds)}
    mtp = layer_terms(c, c.m.moe is not None) if sp.mtp else []
    io = stage_io_terms(c, sp.first, sp.last, mtp)
    counts = {moe: kinds.count(moe) for moe in (True, False)}
    terms = {}
    for rc in RECOMPUTE_LEVELS:
        io_kept = [t for t in io if keep(t.group, rc, c)]
        if rc == "full":
            terms[rc] = _sum(_kept_full(c, kinds, per) + io_kept)
            continue
        # every layer of a kind keeps the same terms: filter one, count it (as _every + _sum)
        kept = [(t, counts[moe]) for moe in (True, False) if counts[moe] for t in per[moe]]
        terms[rc] = _sum_counted([(t, n) for t, n in kept if keep(t.group, rc, c)], io_kept)
    acts = {rc: sum(t.bytes for t in terms[rc]) for rc in RECOMPUTE_LEVELS}
    loss = loss_backward(c) if (sp.last or sp.mtp) else 0
    # A layer's backward runs after the loss's: its kept tensors are gone by then.
    freed = sum(t.bytes for t in io if t.name.startswith(("head.", "loss."))) if sp.last else 0
    work = {
        rc: max([loss] + [layer_work(c, per[moe], moe, rc, kinds) - freed for moe in per])
        for rc in RECOMPUTE_LEVELS
    }
    return terms, acts, work


def layer_work(c: Ctx, layer: list[Term], moe: bool, rc: Recompute, kinds: tuple[bool, ...]) -> int:
    """One layer's backward: its recomputed unit (if any) plus its temporaries."""
    unit = 1
    if c.r is not None and not c.eager and c.r.recompute_method == "uniform":
        unit = min(c.r.recompute_num_layers, max(len(kinds), 1))
    ffn = sum(t.bytes for t in layer if t.name.startswith(("mlp.", "moe.")))
    return recomputed_unit(c, layer, rc, unit) + layer_temporaries(c, moe, ffn)


def prepare(
    m: ModelSpec, layout: Layout, training: Training, conv: Convention, r: Resolved
) -> list[PreparedDevice]:
    """Parameters and activation terms of every device of ``layout``."""
    c = make_ctx(m, layout, training, conv, r)
    pad, tail, pattern = r.framework in ("megatron", "deepseek"), _tail(c), _kinds(m)
    stages = []
    for i, layers in enumerate(partition(m.layers, layout)):
        sp = stage_params(m, layout, conv, layers, i, r.mtp, pad)
        kinds = pattern[layers.start : layers.stop]
        terms, acts, work = _stage_terms(c, sp, kinds)
        const, moments = (
            (None, ())  # a traced profile replays the whole step (``traced_device``)
            if isinstance(c.profile, TracedProfile)
            else eager_moments(c, sp, kinds, layout, acts, layer_work)
        )
        stages.append(PreparedStage(i, layers, sp, terms, acts, work, tail, const, moments))
    return [
        _device(m, rank, tuple(stages[j] for j in held))
        for rank, held in enumerate(placement(layout))
    ]


def _device(m: ModelSpec, rank: int, own: tuple[PreparedStage, ...]) -> PreparedDevice:
    first = own[0]
    if len(own) == 1:
        consts = first.const or dict.fromkeys(RECOMPUTE_LEVELS, 0)
        return PreparedDevice(
            rank, own, first.params.split, first.params.largest_layer, first.work, consts
        )
    split = Split()
    for st in own:
        split += st.params.split
    if m.tie_embeddings and first.params.first and own[-1].params.last:
        split += Split(non_moe=-first.params.embedding)  # one matrix serves both ends
    largest = max(st.params.largest_layer for st in own)
    works = {rc: max(st.work[rc] for st in own) for rc in RECOMPUTE_LEVELS}
    consts = {
        rc: sum(st.const[rc] for st in own if st.const is not None) for rc in RECOMPUTE_LEVELS
    }
    return PreparedDevice(rank, own, split, largest, works, consts)


@lru_cache(maxsize=64)
def _kinds(m: ModelSpec) -> tuple[bool, ...]:
    """Whether each layer is an MoE layer."""
    return tuple(m.is_moe_layer(j) for j in range(m.layers))


def _tail(c: Ctx) -> dict[Recompute, int] | None:
    """Per-sample end-of-backward bytes of an eager profile that has the term."""
    if not isinstance(c.profile, EagerProfile):
        return None
    found = {rc: eager_tail(c.profile, rc, c.s, c.t) for rc in RECOMPUTE_LEVELS}
    return {rc: v[0] for rc, v in found.items() if v is not None} or None


def device_in_flight(
    dev: PreparedDevice, layout: Layout, rc: Recompute, m: int
) -> tuple[int, tuple[int, ...]]:
    """(per-sample bytes of every in-flight micro-batch at the device's peak, the in-flight
    count of each held stage at that peak)."""
    held = tuple(st.index for st in dev.stages)
    if layout.schedule != "interleaved" or layout.pp == 1:
        counts = held_counts(layout, dev.index, held, m)
        return sum(n * st.acts[rc] for n, st in zip(counts, dev.stages, strict=True)), counts
    best, at = -1, tuple[int, ...]()
    for state in interleaved_states(layout, dev.index, m):
        total = sum(n * st.acts[rc] for n, st in zip(state, dev.stages, strict=True))
        if total > best:
            best, at = total, state
    return best, at
