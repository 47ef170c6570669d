"""The ``traced`` profile: the user's own training step, replayed window by window.

Why it exists: the ``eager`` profile (``profile.py``) fits one straight line to the peak of
reduced models, which is only right while the peak stays at the start of backward; tiny
micro-batches, gradient-heavy MoE layers and checkpointing move it (see issue 14). This profile
keeps what ``dssup calibrate --hf/--module`` measures in each *window* of a traced step --

    fwd:pre      embedding, rotary tables, masks          fwd:block  one repeated block's forward
    fwd:post     final norm, head, loss                   bwd:head   backward until the last block
    bwd:block    one block's backward (its recompute too)  bwd:embed  after the first block
    optimizer    AdamW's step over W + G + O

-- as bytes at the window's own peak and at its end, over what was alive at its start, each
``b * per_sample(s) + constant(s)`` with ``x(s) = c0 + c1*s + c2*s*s_keys`` (attention scores
are the ``s*s_keys`` part), plus the gradient bytes the window creates. ``replay`` walks a
stage's blocks in order (dense first, as built) and back, and returns every candidate peak as an
affine function of the micro-batch: the peak is their maximum, whatever the regime, for any layer
count. Everything here is pure arithmetic on the stored coefficients (no torch, no files).

Composition beyond one device (modelled, not traced): gradient bytes scale with the memory
model's own gradient sharding; with sequence parallelism every per-sample byte divides by TP
(Megatron's split; without ``sp`` nothing divides: an upper bound), with CP per-token bytes are
those of s/CP tokens and scores (s/CP)*s; routed-expert bytes scale by the MoE imbalance; stages
without the embedding (or the head) skip those windows; in-flight micro-batches of a pipeline
hold their blocks' stored bytes each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

__all__ = [
    "BatchTerm",
    "Candidate",
    "KindTrace",
    "LevelTrace",
    "Moment",
    "Provenance",
    "ReplayStage",
    "SeqPoly",
    "TracedProfile",
    "Window",
    "replay",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class SeqPoly(BaseModel):
    """``c0 + c1 * s + c2 * s * s_keys`` bytes (s: tokens per sequence on the device)."""

    model_config = _FROZEN
    c: tuple[float, float, float] = Field(
        description="bytes, bytes per token, bytes per token x key (attention scores)"
    )

    def at(self, s: int, s_keys: int) -> float:
        return self.c[0] + self.c[1] * s + self.c[2] * s * s_keys


class BatchTerm(BaseModel):
    """``b * per_sample(s) + constant(s)`` bytes."""

    model_config = _FROZEN
    per_sample: SeqPoly = Field(description="bytes per sequence of the micro-batch")
    constant: SeqPoly = Field(description="batch-independent bytes (weight casts, tables, masks)")


class Moment(BaseModel):
    """One moment of a window that can hold the peak (right after an operator)."""

    model_config = _FROZEN
    bytes: BatchTerm = Field(description="bytes over the window's start")
    grads: int = Field(0, ge=0, description="of them, gradient bytes created in the window")


class Window(BaseModel):
    """What one window of the step adds over what was alive when it started."""

    model_config = _FROZEN
    moments: list[Moment] = Field(
        description="every moment that is the window's peak for some micro-batch and length"
    )
    end: BatchTerm = Field(description="bytes at its end over its start (negative: frees)")
    grads: int = Field(0, ge=0, description="gradient bytes the window creates (at its end)")
    routed: float = Field(
        0.0, ge=0.0, le=1.0, description="share of the per-sample bytes made by routed experts"
    )


class KindTrace(BaseModel):
    """One repeated block of a kind (dense or moe) at one recompute level."""

    model_config = _FROZEN
    forward: Window = Field(description="its forward: end = what it keeps for backward")
    backward: Window = Field(description="its backward window (recompute included)")
    parameters: int = Field(ge=0, description="parameters of one block as traced")
    released: BatchTerm | None = Field(
        None,
        description="bytes of its forward's end that leaving autocast frees (its cached weight "
        "casts when checkpointed), per block; None: nothing",
    )


class LevelTrace(BaseModel):
    """The windows of one recompute level (none, or full = every block checkpointed)."""

    model_config = _FROZEN
    inputs: BatchTerm = Field(description="alive the whole step: the batch, buffers")
    pre: Window = Field(description="from the step's start to the first block")
    post: Window = Field(description="after the last block to the loss")
    head: Window = Field(description="backward before the last block's")
    embed: Window = Field(description="backward after the first block's")
    first_forward: Window = Field(
        description="the model's first block's forward (it may create what later ones reuse)"
    )
    first_backward: Window = Field(
        description="the first block's backward (it frees what the blocks shared: RoPE tables)"
    )
    kinds: dict[str, KindTrace] = Field(description="'dense' and/or 'moe': any later block")
    first_released: BatchTerm | None = Field(
        None, description="``KindTrace.released`` of the model's first block"
    )


class Provenance(BaseModel):
    """Where a profile came from, so a user can tell whether it still describes their job."""

    model_config = _FROZEN
    source: str = Field(description="hf, module or reference")
    model: str = Field(description="config path or factory import path")
    model_type: str | None = Field(None, description="the config's model_type (hf)")
    versions: dict[str, str] = Field(description="torch, transformers, python")
    knobs: dict[str, str] = Field(description="dtype, attention, optimizer, recompute levels")
    micro_batches: tuple[int, ...] = Field(description="micro-batches of the fitted traces")
    seq_lens: tuple[int, ...] = Field(description="sequence lengths of the fitted traces")
    check_seq_len: int = Field(description="sequence length of the check trace")
    traces: int = Field(description="traces run")
    seconds: float = Field(description="wall time of the calibration, s")
    peak_rss_bytes: int = Field(0, ge=0, description="peak resident memory of the calibration")
    created: str = Field(description="UTC time of the calibration")


class TracedProfile(BaseModel):
    """Trace-derived windows of the user's own training step (one dtype, attention, optimizer)."""

    model_config = _FROZEN
    kind: Literal["traced"] = Field("traced", description="profile family")
    version: Literal[2] = Field(2, description="profile format version")
    provenance: Provenance = Field(description="source, versions, knobs, traced points")
    dtype: str = Field(description="fp32, bf16 or amp")
    optimizer: str = Field(description="AdamW implementation")
    attention: str = Field(description="attention implementation traced")
    levels: dict[str, LevelTrace] = Field(description="'none' and/or 'full' (and 'selective')")
    optimizer_transient_per_param: float = Field(
        ge=0.0, description="optimizer-step temporaries, bytes per optimizer-shard parameter"
    )
    blocks: dict[str, int] = Field(description="repeated blocks per kind in the whole model")
    first_dense: int = Field(ge=0, description="dense blocks before the first MoE block")
    found: str = Field(description="what block discovery found, in words")
    mtp_modules: list[str] = Field(
        default_factory=list, description="multi-token-prediction modules found (none: not built)"
    )
    stage_parameters: int = Field(ge=0, description="parameters outside the blocks, as traced")
    breakdown: list[tuple[str, int, int]] = Field(
        default_factory=list,
        description="largest tensor groups at the forward/backward peak of the largest trace: "
        "(op @ module, count, bytes)",
    )
    worst_check: float = Field(
        description="largest relative miss of the fit on its own check traces"
    )

    _hash: int | None = PrivateAttr(None)

    def __hash__(self) -> int:  # the estimator caches on it; the fields hold lists and dicts
        if self._hash is None:
            self._hash = hash(self.model_dump_json())
        return self._hash

    def __eq__(self, other: object) -> bool:  # the fields, not the cached hash
        return isinstance(other, TracedProfile) and self.__dict__ == other.__dict__

    @property
    def source(self) -> str:
        """One line for the assumptions list."""
        p = self.provenance
        return (
            f"{p.source} {p.model}, {self.dtype}, {self.attention} attention, AdamW "
            f"{self.optimizer}, " + ", ".join(f"{k} {v}" for k, v in p.versions.items())
        )

    @property
    def seq_len(self) -> int:
        """The longest sequence traced (predictions beyond it extrapolate)."""
        return max(self.provenance.seq_lens)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One possible peak: ``base + slope * b`` bytes over the stage's states."""

    phase: str  # forward | backward
    where: str  # the window
    base: float
    slope: float

    def at(self, b: int) -> int:
        return math.ceil(self.base + self.slope * b)


@dataclass(frozen=True, slots=True)
class ReplayStage:
    """What ``replay`` needs to know about one pipeline stage and the job."""

    order: tuple[tuple[str, int], ...]  # (kind, count) in model order (dense first)
    first: bool  # holds the embedding
    last: bool  # holds the head and the loss
    s: int  # tokens per sequence on the device (s / cp)
    s_keys: int  # keys each query attends to (s)
    per_sample_divisor: int  # tp with sequence parallelism, else 1
    grad_scale: float  # device gradient bytes / traced gradient bytes (ZeRO-2/3, TP, EP)
    accumulate: bool  # gradients already alive (accumulation): windows add into them
    in_flight: int  # micro-batches whose stored bytes are alive (pipeline schedule)
    imbalance: float  # routed tokens per rank / mean


def _affine(t: BatchTerm, st: ReplayStage, routed: float = 0.0) -> tuple[float, float]:
    per = t.per_sample.at(st.s, st.s_keys) / st.per_sample_divisor
    per *= 1.0 + routed * (st.imbalance - 1.0)
    return t.constant.at(st.s, st.s_keys), per


def _window(w: Window, st: ReplayStage) -> tuple[list[tuple[float, float]], tuple[float, float]]:
    """(moments, end) as (constant, per-sample) with the gradients scaled or accumulated."""
    out = []
    for mo in w.moments:
        c, p = _affine(mo.bytes, st, w.routed)
        out.append((c if st.accumulate else c + (st.grad_scale - 1.0) * mo.grads, p))
    en = _affine(w.end, st, w.routed)
    if st.accumulate:  # the gradients exist; the window's new ones are added into them
        return out, (en[0] - w.grads, en[1])
    return out, (en[0] + (st.grad_scale - 1.0) * w.grads, en[1])


def _stored(lv: LevelTrace, st: ReplayStage) -> tuple[float, float]:
    """Bytes one micro-batch keeps on this stage between its forward and its backward."""
    base, per = _window(lv.pre, st)[1]  # embedding output and tables (later stages: input)
    for i, (kind, count) in enumerate(st.order):
        c, p = _window(lv.kinds[kind].forward, st)[1]
        n = count
        if i == 0 and st.first:
            c0, p0 = _window(lv.first_forward, st)[1]
            base, per, n = base + c0, per + p0, count - 1
        base, per = base + n * c, per + n * p
    return base, per


def _released(lv: LevelTrace, st: ReplayStage) -> tuple[float, float]:
    """What leaving autocast frees of the stage's blocks' forward bytes (cached weight casts)."""
    base = per = 0.0
    for i, (kind, count) in enumerate(st.order):
        n, terms = count, []
        if i == 0 and st.first and lv.first_released is not None:
            terms.append((lv.first_released, 1))
        if i == 0 and st.first:
            n -= 1
        rel = lv.kinds[kind].released
        if rel is not None:
            terms.append((rel, n))
        for t, k in terms:
            c, p = _affine(t, st)
            base, per = base + k * c, per + k * p
    return base, per


def replay(p: TracedProfile, level: str, st: ReplayStage) -> list[Candidate]:
    """Every candidate peak of one stage's step, over W + O (+ G when accumulating)."""
    lv = p.levels[level]
    extra = max(st.in_flight - 1, 0)
    sb, sp = _stored(lv, st)
    m = _affine(lv.inputs, st)
    m = (m[0] + extra * sb, m[1] + extra * sp)
    out: list[Candidate] = []

    def at(phase: str, where: str, moments: list[tuple[float, float]], times: int = 0,
           step: tuple[float, float] = (0.0, 0.0)) -> None:  # fmt: skip
        base, slope = m[0] + times * step[0], m[1] + times * step[1]
        out.extend(Candidate(phase, where, base + c, slope + p) for c, p in moments)

    def add(d: tuple[float, float], n: int = 1) -> tuple[float, float]:
        return m[0] + n * d[0], m[1] + n * d[1]

    pk, en = _window(lv.pre, st)
    if st.first:
        at("forward", "fwd:pre", pk)
    m = add(en)  # a later stage receives its input instead: counted as the same bytes (bound)
    for i, (kind, count) in enumerate(st.order):
        n = count
        if i == 0 and st.first:  # the model's first block
            pk, en = _window(lv.first_forward, st)
            at("forward", f"fwd:{kind}", pk)
            m, n = add(en), count - 1
        pk, en = _window(lv.kinds[kind].forward, st)
        at("forward", f"fwd:{kind}", pk, max(n - 1, 0), en)
        m = add(en, n)
    if st.last:
        pk, en = _window(lv.post, st)
        at("forward", "fwd:post", pk)
        m = add(en)
    rel = _released(lv, st)  # leaving autocast (after the loss; a middle stage: its blocks)
    m = (m[0] - rel[0], m[1] - rel[1])
    if st.last:
        pk, en = _window(lv.head, st)
        at("backward", "bwd:head", pk)
        m = add(en)
    for i, (kind, n) in reversed(list(enumerate(st.order))):
        own = 1 if i == 0 and st.first else 0  # the model's first block goes last
        pk, en = _window(lv.kinds[kind].backward, st)
        if n - own > 0:
            at("backward", f"bwd:{kind}", pk)  # the segment's first block in backward
            at("backward", f"bwd:{kind}", pk, n - own - 1, en)  # its last: the peak is at an end
            m = add(en, n - own)
        if own:
            pk, en = _window(lv.first_backward, st)
            at("backward", f"bwd:{kind}", pk)
            m = add(en)
    if st.first:
        at("backward", "bwd:embed", _window(lv.embed, st)[0])
    return out
