"""The arithmetic shared by ``estimate`` and ``plan``, so both always agree to the byte.

A pipeline stage is prepared once per layout: its parameters and its per-sample activation
terms depend only on which layers it holds (stages with the same kind of layers share the
work). A device (pipeline rank) holds one or more stages (``stages.placement``): its model
states are those of all its stages, its activations the in-flight micro-batches of each stage
at the device's peak (``schedule.py``). Everything that varies per config -- micro-batch,
accumulation, recompute, ZeRO, offload -- is then a handful of integer operations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from operator import mul

from dssup.memory.activations import Ctx, Term
from dssup.memory.config import RECOMPUTE_LEVELS, Convention, Layout, Recompute, Training
from dssup.memory.defaults import Resolved
from dssup.memory.moments import Moment, eager_moments
from dssup.memory.params import Split
from dssup.memory.profile import EagerProfile, eager_tail
from dssup.memory.schedule import held_counts, interleaved_states
from dssup.memory.spec import ModelSpec
from dssup.memory.stage_terms import ContextTerms, layer_work
from dssup.memory.stages import (
    StageParams,
    padded_vocab,
    partition,
    placement,
    stage_params,
)
from dssup.memory.states import States, constant, finish, states, tails, zero3_working_set
from dssup.memory.traced import TracedProfile

__all__ = [
    "PreparedDevice",
    "PreparedStage",
    "States",
    "constant",
    "device_in_flight",
    "finish",
    "in_flight_levels",
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
    terms: Mapping[Recompute, tuple[Term, ...]]  # kept per-sample terms by recompute level
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


def prepare(
    m: ModelSpec, layout: Layout, training: Training, conv: Convention, r: Resolved
) -> list[PreparedDevice]:
    """Parameters and activation terms of every device of ``layout``."""
    c = make_ctx(m, layout, training, conv, r)
    tail, (table, cache), last = _tail(c), _stage_kinds(c), layout.stages - 1
    stages = []
    for i, layers in enumerate(partition(m.layers, layout)):
        key = (layers.start, layers.stop, i == 0, i == last)
        kind = table.get(key)
        if kind is None:
            if len(table) >= 4096:
                table.clear()
            kind = table[key] = _stage_kind(cache, layout, layers, i)
        sp, terms, acts, work, const, moments = kind
        stages.append(PreparedStage(i, layers, sp, terms, acts, work, tail, const, moments))
    return [
        _device(m, rank, tuple(stages[j] for j in held))
        for rank, held in enumerate(placement(layout))
    ]


_Kind = tuple[
    StageParams,
    Mapping[Recompute, tuple[Term, ...]],
    dict[Recompute, int],
    dict[Recompute, int],
    dict[Recompute, int] | None,
    tuple[Moment, ...],
]


@lru_cache(maxsize=64)
def _stage_kinds(c: Ctx) -> tuple[dict[tuple[int, int, bool, bool], _Kind], ContextTerms]:
    """The stages met under one context, by (first layer, end, first stage, last stage): what
    a stage holds and keeps depends on nothing else (the context fixes the model, TP, EP, the
    convention and the resolved settings), so layouts that share a stage share its kind, and
    the context is hashed once per ``prepare``. Callers must not mutate the entries."""
    return {}, ContextTerms(c)


def _stage_kind(cache: ContextTerms, layout: Layout, layers: range, i: int) -> _Kind:
    c = cache.c
    r, m = c.r, c.m
    assert r is not None  # ``make_ctx`` sets it; not input validation
    pad = r.framework in ("megatron", "deepseek")
    sp = stage_params(m, layout, c.conv, layers, i, r.mtp, pad)
    kinds = _kinds(m)[layers.start : layers.stop]
    terms, acts, work = cache.stage(sp, kinds)
    const, moments = (
        (None, ())  # a traced profile replays the whole step (``traced_device``)
        if isinstance(c.profile, TracedProfile)
        else eager_moments(c, sp, kinds, layout, acts, layer_work)
    )
    return sp, terms, acts, work, const, moments


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
    acts = [st.acts[rc] for st in dev.stages]
    for state in interleaved_states(layout, dev.index, m):
        total = sum(map(mul, state, acts))  # the chunks' counts times their bytes
        if total > best:
            best, at = total, state
    return best, at


def in_flight_levels(dev: PreparedDevice, layout: Layout, m: int) -> dict[Recompute, int]:
    """``device_in_flight``'s bytes at every recompute level (the counts found once when they
    do not depend on the level: every schedule but interleaving)."""
    if layout.schedule == "interleaved" and layout.pp > 1:
        return {rc: device_in_flight(dev, layout, rc, m)[0] for rc in RECOMPUTE_LEVELS}
    counts = held_counts(layout, dev.index, tuple(st.index for st in dev.stages), m)
    held = list(zip(counts, dev.stages, strict=True))
    return {rc: sum(n * st.acts[rc] for n, st in held) for rc in RECOMPUTE_LEVELS}
