"""A stage's kept activation terms, their bytes and its backward working set per recompute level.

Why a module of its own, and why per layer kind: every layer of a kind (MoE or dense) keeps the
same terms under one context, so a stage's terms are each kind's terms -- filtered and summed by
name once per context (``_LayerKind``) -- times how many layers of it the stage holds, plus the
stage's own input/output terms. The planner meets a few hundred stage kinds in one search and
reads only their bytes (integers: the same totals summed either way), so the named ``Term``
tuples that ``estimate`` reports are built when first asked for (``StageTerms``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from dssup.memory.activations import FULL_KEEP, Ctx, Term, keep, layer_terms, stage_io_terms
from dssup.memory.backward import layer_temporaries, loss_backward, recomputed_unit
from dssup.memory.config import RECOMPUTE_LEVELS, Recompute
from dssup.memory.profile import eager_terms
from dssup.memory.stages import StageParams
from dssup.memory.traced import TracedProfile
from dssup.memory.traced_stage import stored_terms

__all__ = ["ContextTerms", "StageTerms", "layer_work"]

# (name, group) keys in first-seen order, and their bytes
_Summed = tuple[tuple[tuple[str, str], ...], tuple[int, ...]]
_Levels = dict[Recompute, int]


class StageTerms(Mapping[Recompute, tuple[Term, ...]]):
    """Kept terms by recompute level, each level summed by name when first read: the summed
    terms of every layer kind (times its layer count), then the stage's own terms (``io``:
    those each level keeps); ``made`` holds the levels built already."""

    __slots__ = ("_counts", "_io", "_made")

    def __init__(
        self,
        counts: list[tuple[_LayerKind, int]],
        io: dict[Recompute, list[Term]],
        made: dict[Recompute, tuple[Term, ...]],
    ) -> None:
        self._counts = counts
        self._io = io
        self._made = made

    def __getitem__(self, rc: Recompute) -> tuple[Term, ...]:
        found = self._made.get(rc)
        if found is None:
            rest = self._io[rc]  # KeyError for a level the stage has no terms of
            found = self._made[rc] = _sum_counted([(k.kept[rc], n) for k, n in self._counts], rest)
        return found

    def __iter__(self) -> Iterator[Recompute]:
        return iter(RECOMPUTE_LEVELS)

    def __len__(self) -> int:
        return len(RECOMPUTE_LEVELS)


_Stage = tuple[Mapping[Recompute, tuple[Term, ...]], _Levels, _Levels]


class ContextTerms:
    """What the stages of one context keep, cached by what a stage holds: stages at other
    places and in other layouts with the same make-up share them (the context fixes the
    model, TP, EP, the convention and the resolved settings). Callers must not mutate what
    it returns."""

    __slots__ = ("_io", "_layers", "_stages", "c", "every")

    def __init__(self, c: Ctx) -> None:
        self.c = c
        self.every = _every_layer_checkpointed(c)
        self._stages: dict[tuple[int, tuple[bool, ...]], tuple[StageParams, _Stage]] = {}
        self._layers: dict[bool, _LayerKind] = {}
        self._io: dict[tuple[bool, bool, bool], tuple[dict[Recompute, list[Term]], int]] = {}

    def stage(self, sp: StageParams, kinds: tuple[bool, ...]) -> _Stage:
        """Kept terms, kept bytes and the backward working set of a stage per recompute
        level. Keyed by the parameters' object (``stages.kind_params`` makes one per kind;
        the entry keeps it alive, so its id is not reused): hashing it field by field cost
        more than the lookup saved."""
        key = (id(sp), kinds)
        found = self._stages.get(key)
        if found is None or found[0] is not sp:
            if len(self._stages) >= 4096:
                self._stages.clear()
            found = self._stages[key] = (sp, self._stage(sp, kinds))
        return found[1]

    def _stage(self, sp: StageParams, kinds: tuple[bool, ...]) -> _Stage:
        c = self.c
        if c.profile is not None:
            terms = _eager_profile_terms(c, sp)
            zero = dict.fromkeys(RECOMPUTE_LEVELS, 0)
            return terms, {rc: sum(t.bytes for t in terms[rc]) for rc in RECOMPUTE_LEVELS}, zero
        per = {moe: self.layer(moe) for moe in set(kinds)}
        io_kept, freed = self.io(sp.first, sp.last, sp.mtp)
        counts = [(per[moe], n) for moe in (True, False) if (n := kinds.count(moe))]
        made: dict[Recompute, tuple[Term, ...]] = {}
        acts: _Levels = {}
        for rc in RECOMPUTE_LEVELS:
            io_rc = io_kept[rc]
            if rc == "full" and not self.every:
                full = _kept_full(c, kinds, {moe: k.terms for moe, k in per.items()})
                made[rc] = _sum(full + io_rc)
                acts[rc] = sum(t.bytes for t in made[rc])
                continue
            # every layer of a kind keeps the same terms: sum one, count it (as _every + _sum)
            acts[rc] = sum(k.bytes[rc] * n for k, n in counts) + sum(t.bytes for t in io_rc)
        loss = loss_backward(c) if (sp.last or sp.mtp) else 0
        work = {
            rc: max([loss] + [k.work(c, rc, kinds) - freed for k in per.values()])
            for rc in RECOMPUTE_LEVELS
        }
        return StageTerms(counts, io_kept, made), acts, work

    def layer(self, moe: bool) -> _LayerKind:
        """One layer kind's terms."""
        found = self._layers.get(moe)
        if found is None:
            found = self._layers[moe] = _LayerKind(self.c, moe)
        return found

    def io(self, first: bool, last: bool, mtp: bool) -> tuple[dict[Recompute, list[Term]], int]:
        """A stage's own terms (token ids; final norm, loss, MTP) that each level keeps, and
        the bytes a layer's backward finds freed: the loss's backward runs first, so its kept
        tensors are gone by then."""
        key = (first, last, mtp)
        found = self._io.get(key)
        if found is None:
            c = self.c
            mtp_terms = self.layer(c.m.moe is not None).terms if mtp else []
            io = stage_io_terms(c, first, last, mtp_terms)
            kept = {rc: [t for t in io if keep(t.group, rc, c)] for rc in RECOMPUTE_LEVELS}
            freed = sum(t.bytes for t in io if t.name.startswith(("head.", "loss."))) if last else 0
            found = self._io[key] = (kept, freed)
        return found


class _LayerKind:
    """One layer kind's terms under a context, summed by name per recompute level (under
    ``full``: what checkpointing every layer keeps), their bytes, and its backward working
    sets."""

    __slots__ = ("bytes", "kept", "moe", "terms", "works")

    def __init__(self, c: Ctx, moe: bool) -> None:
        self.moe = moe
        self.terms = layer_terms(c, moe)
        self.kept: dict[Recompute, _Summed] = {}
        names = [(t.name, t.group) for t in self.terms]  # one key per term, for every level
        for rc in RECOMPUTE_LEVELS:
            sums: dict[tuple[str, str], int] = {}
            for t, key in zip(self.terms, names, strict=True):
                if (t.group in FULL_KEEP) if rc == "full" else keep(t.group, rc, c):
                    sums[key] = sums.get(key, 0) + t.bytes
            self.kept[rc] = (tuple(sums), tuple(sums.values()))
        self.bytes = {rc: sum(kept[1]) for rc, kept in self.kept.items()}
        self.works: dict[tuple[Recompute, int], int] = {}

    def work(self, c: Ctx, rc: Recompute, kinds: tuple[bool, ...]) -> int:
        """``layer_work`` of this kind in a stage of ``kinds`` (it reads only their unit)."""
        key = (rc, _unit(c, kinds))
        found = self.works.get(key)
        if found is None:
            found = self.works[key] = layer_work(c, self.terms, self.moe, rc, kinds)
        return found


def _every_layer_checkpointed(c: Ctx) -> bool:
    """Whether full recompute checkpoints every layer (``_kept_full``'s uniform, one layer)."""
    r = c.r
    if r is None or c.conv == "paper" or c.eager:
        return True
    return r.recompute_method == "uniform" and r.recompute_num_layers == 1


def layer_work(c: Ctx, layer: list[Term], moe: bool, rc: Recompute, kinds: tuple[bool, ...]) -> int:
    """One layer's backward: its recomputed unit (if any) plus its temporaries."""
    ffn = sum(t.bytes for t in layer if t.name.startswith(("mlp.", "moe.")))
    return recomputed_unit(c, layer, rc, _unit(c, kinds)) + layer_temporaries(c, moe, ffn)


def _unit(c: Ctx, kinds: tuple[bool, ...]) -> int:
    """Layers full recompute re-forwards at once in a stage of ``kinds`` (Megatron's uniform
    method: ``recompute_num_layers``, at most the stage's; else one)."""
    if c.r is not None and not c.eager and c.r.recompute_method == "uniform":
        return min(c.r.recompute_num_layers, max(len(kinds), 1))
    return 1


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


def _sum_counted(layers: list[tuple[_Summed, int]], rest: list[Term]) -> tuple[Term, ...]:
    """``_sum`` of every layer kind's summed terms (each kind ``n`` times) then ``rest``, in
    that order."""
    sums: dict[tuple[str, str], int] = {}
    for (keys, values), n in layers:
        for key, b in zip(keys, values, strict=True):
            sums[key] = sums.get(key, 0) + b * n
    for t in rest:
        sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes
    return tuple(Term(name, group, b) for (name, group), b in sums.items())


def _sum(terms: list[Term]) -> tuple[Term, ...]:
    sums: dict[tuple[str, str], int] = {}
    for t in terms:
        sums[(t.name, t.group)] = sums.get((t.name, t.group), 0) + t.bytes
    return tuple(Term(name, group, b) for (name, group), b in sums.items())
