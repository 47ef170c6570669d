"""Floating-point work of one pipeline device per sequence: what the step-time model divides by
the GPU's FLOP/s.

Why count per module instead of ``6 * N_active * tokens``: MLA's down-projections are not split
by tensor parallelism, attention scores grow with the sequence, MoE layers run ``top_k`` experts
of their own size, the head is a large GEMM on one stage only, and recompute re-runs chosen
modules. Each of those moves both the step time and which layout is best.

Conventions (per token, forward; backward is twice the GEMMs and 2.5 x the attention core,
the FlashAttention-2 paper's count, arXiv 2307.08691 sec. 3.2):

* a GEMM of an ``[n, k]`` input with a ``[k, m]`` weight costs ``2 n k m``;
* causal attention scores and the value product cost ``2 (d_qk + d_v)`` per key and head, with
  ``(s+1)/2`` keys on average under the causal mask (fewer for sliding-window layers);
* an MLP is 3 matrices (gated: SwiGLU/GeGLU) or 2 (plain GELU MLPs), for experts too;
* with sequence parallelism (Megatron's requirement for MoE with TP) the token dimension of
  everything outside the split matrices is divided by TP too; context parallelism divides the
  tokens of a sequence by CP.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from operator import attrgetter

from dssup.memory.config import Layout, Recompute
from dssup.memory.memo import ModelMemo
from dssup.memory.spec import ModelSpec
from dssup.memory.stages import moe_layers_in, padded_vocab, partition

__all__ = ["DeviceWork", "LayerWork", "device_work", "layer_work"]

BACKWARD_GEMM = 2.0  # dgrad + wgrad, each the size of the forward GEMM
BACKWARD_CORE = 2.5  # FlashAttention-2 backward: 5 matmuls against the forward's 2


@dataclass(frozen=True, slots=True)
class LayerWork:
    """Forward FLOPs per token of one layer on one GPU, by what recompute can repeat."""

    attn_gemm: float  # projections (q/kv up and down, output)
    up_proj: float  # the part of attn_gemm Megatron's mla_up_proj recompute repeats
    core: float  # attention scores and value product
    ffn_gemm: float  # dense MLP, or routed experts + router
    shared_gemm: float  # shared experts (MoE layers)
    routed_slots: float  # routed (token, expert) pairs per token on this GPU (a2a payload)


@lru_cache(maxsize=512)
def layer_work(
    m: ModelSpec, tp: int, cp: int, sp: bool, seq: int, moe: bool, imbalance: float = 1.0
) -> LayerWork:
    """FLOPs per token (of the sequence, before CP) of one layer on one GPU; ``imbalance``
    (max/mean routed tokens per rank) scales the busiest rank's expert work and traffic."""
    h = m.hidden
    shard = tp if sp else 1  # token dimension of replicated parts under SP
    if m.mla is None:
        d = m.head_dim
        qkv = 2 * h * (m.heads * d + 2 * m.kv_heads * d)
        out = 2 * m.heads * d * h
        attn, up = (qkv + out) / tp, 2 * h * m.heads * d / tp
        core = m.heads * 4 * d * _keys(m, seq) / tp
    else:
        a = m.mla
        dqk = a.qk_nope_head_dim + a.qk_rope_head_dim
        down = 2 * h * (a.kv_lora_rank + a.qk_rope_head_dim)
        if a.q_lora_rank:
            down += 2 * h * a.q_lora_rank
            q_up = 2 * a.q_lora_rank * m.heads * dqk
        else:
            q_up = 2 * h * m.heads * dqk
        kv_up = 2 * a.kv_lora_rank * m.heads * (a.qk_nope_head_dim + a.v_head_dim)
        out = 2 * m.heads * a.v_head_dim * h
        up = (q_up + kv_up) / tp
        attn = up + out / tp + down / shard
        core = m.heads * 2 * (dqk + a.v_head_dim) * _keys(m, seq) / tp
    mats = 3 if m.mlp_kind == "gated" else 2  # gate, up, down; or fc1, fc2
    if moe and m.moe is not None:
        e = m.moe
        routed = imbalance * e.top_k * 2 * mats * h * e.expert_ffn / shard
        shared = e.n_shared * 2 * mats * h * e.shared_ffn / tp
        ffn, slots = routed + 2 * h * e.n_routed / shard, imbalance * e.top_k / shard
    else:
        ffn, shared, slots = 2 * mats * h * m.ffn / tp, 0.0, 0.0
    del cp  # tokens per sequence are divided by CP by the caller (per-sequence totals)
    return LayerWork(attn, up, core, ffn, shared, slots)


def _keys(m: ModelSpec, seq: int) -> float:
    """Keys a query attends to on average under the causal mask, over the model's layers:
    ``(s+1)/2`` for full attention; with a window ``w < s``, ``w - w(w-1)/(2s)``."""
    full = (seq + 1) / 2
    if not m.sliding_window or not m.sliding_layers or m.sliding_window >= seq:
        return full
    w = m.sliding_window
    window = w - w * (w - 1) / (2 * seq)
    return (full * (m.layers - m.sliding_layers) + window * m.sliding_layers) / m.layers


@dataclass(frozen=True, slots=True)
class DeviceWork:
    """Per sequence (b = 1) on one pipeline device: forward FLOPs, split by what recompute can
    repeat (Megatron's recompute modules, or whole layers)."""

    gemm: float  # forward GEMM FLOPs (layers, head, MTP)
    core: float  # forward attention-core FLOPs
    layer_gemm: float  # the transformer layers' GEMMs: what full recompute repeats
    up: float  # MLA / q up-projections (mla_up_proj)
    mlp: float  # dense MLPs (mlp)
    moe: float  # routed experts and routers (moe)
    shared: float  # shared experts (shared_experts)
    layers: float  # transformer layers per micro-batch pass (averaged over DualPipe's two)
    moe_layers: float
    slots: float  # routed token-slots per sequence over all MoE layers (a2a payload, tokens)

    def recompute(
        self, rc: Recompute, modules: frozenset[str], full: float = 1.0
    ) -> tuple[float, float]:
        """(GEMM, attention-core) forward FLOPs recompute repeats: ``full`` is the share of the
        layers full recompute re-runs (Megatron's block method); selective re-runs ``modules``
        (norms and activations are memory-bound, not GEMMs)."""
        if rc == "full":
            return full * self.layer_gemm, full * self.core
        if rc == "none":
            return 0.0, 0.0
        gemm = 0.0
        for name, value in (
            ("mla_up_proj", self.up),
            ("mlp", self.mlp),
            ("moe", self.moe),
            ("shared_experts", self.shared),
        ):
            if name in modules:
                gemm += value
        return gemm, self.core if "core_attn" in modules else 0.0

    def fwd_bwd(
        self, rc: Recompute, modules: frozenset[str] = frozenset({"core_attn"}), full: float = 1.0
    ) -> tuple[float, float]:
        """(GEMM, attention-core) FLOPs per sequence for forward, backward and recompute."""
        g, c = self.recompute(rc, modules, full)
        return self.gemm * (1 + BACKWARD_GEMM) + g, self.core * (1 + BACKWARD_CORE) + c


def _stage_layers(m: ModelSpec, layout: Layout) -> list[tuple[range, bool, bool]]:
    """(layers, first, last) of every (virtual) stage in model order: the memory model's own
    partition (PP x VPP stages when interleaved, an explicit split when given)."""
    parts = partition(m.layers, layout)
    return [(r, i == 0, i == len(parts) - 1) for i, r in enumerate(parts)]


_WORK: dict[tuple[object, ...], tuple[ModelSpec, tuple[DeviceWork, ...]]] = {}


def device_work(
    m: ModelSpec, layout: Layout, seq: int, imbalance: float = 1.0
) -> tuple[DeviceWork, ...]:
    """Work per sequence of every pipeline device (1F1B: its stage; interleaved: its VPP chunks;
    DualPipe: the mean of stages i and PP-1-i, since half the micro-batches pass each).

    Memoised by the model's identity (the entry keeps the model alive, so an id is never
    reused while its entry exists): hashing a pydantic model field by field on every call cost
    more than the arithmetic it saved."""
    lay = layout
    key: tuple[object, ...] = (id(m), lay.tp, lay.cp, lay.sp, lay.pp, lay.vpp, lay.schedule)
    key += (lay.layers_per_stage, seq, imbalance)
    hit = _WORK.get(key)
    if hit is not None:
        return hit[1]
    if len(_WORK) > 4096:
        _WORK.clear()
    works = _device_work(m, lay, seq, imbalance)
    _WORK[key] = (m, works)
    return works


def _device_work(
    m: ModelSpec, layout: Layout, seq: int, imbalance: float
) -> tuple[DeviceWork, ...]:
    """``device_work`` of ``layout``: reads only the fields of its cache key."""
    tp, cp, sp, pp, schedule = layout.tp, layout.cp, layout.sp, layout.pp, layout.schedule
    tokens = seq / cp
    dense = layer_work(m, tp, cp, sp, seq, False)
    moe = layer_work(m, tp, cp, sp, seq, True, imbalance)
    stages: list[DeviceWork] = []
    for r, _, last in _stage_layers(m, layout):
        n_moe = moe_layers_in(m, r)
        held = (n_moe, len(r) - n_moe, last)
        make = partial(_stage, m, layout, *held, dense, moe, tokens)
        stages.append(_STAGES.get(m, (tp, cp, sp, seq, imbalance, *held), make))
    out: list[DeviceWork] = []
    for rank in range(pp):
        if schedule == "dualpipe":
            mirror = pp - 1 - rank
            if mirror < rank:  # the mirror rank's two stages: a + b is b + a, one object
                out.append(out[mirror])
                continue
            out.append(_merge([stages[rank], stages[mirror]], 0.5))
        else:
            out.append(_merge(stages[rank::pp], 1.0))
    return tuple(out)


_STAGES = ModelMemo(4096)  # a stage's work by what it holds: layouts share most stages


def _stage(
    m: ModelSpec,
    layout: Layout,
    n_moe: int,
    n_dense: int,
    last: bool,
    dense: LayerWork,
    moe: LayerWork,
    tokens: float,
) -> DeviceWork:
    blocks = [(dense, float(n_dense)), (moe, float(n_moe))]
    if last and m.mtp_depth:  # each MTP module: a [2h -> h] projection and one more layer
        blocks.append((moe if m.moe is not None else dense, float(m.mtp_depth)))

    def total(field: str, kind: LayerWork | None = None) -> float:
        return tokens * sum(
            n * float(getattr(w, field)) for w, n in blocks if kind is None or w is kind
        )

    layer_gemm = total("attn_gemm") + total("ffn_gemm") + total("shared_gemm")
    gemm = layer_gemm
    if last:  # the head, once for the model and once per MTP module, and MTP projections
        gemm += tokens * head_flops(m, layout) * (1 + m.mtp_depth)
        gemm += tokens * m.mtp_depth * 4 * m.hidden * m.hidden / layout.tp
    mlp = total("ffn_gemm", dense) if dense is not moe else 0.0
    return DeviceWork(
        gemm=gemm,
        core=total("core"),
        layer_gemm=layer_gemm,
        up=total("up_proj"),
        mlp=mlp,
        moe=total("ffn_gemm", moe) if m.moe is not None else 0.0,
        shared=total("shared_gemm"),
        layers=sum(n for _, n in blocks),
        moe_layers=sum(n for w, n in blocks if w is moe),
        slots=total("routed_slots"),
    )


def head_flops(m: ModelSpec, layout: Layout) -> float:
    """Forward FLOPs per token of the output head on one TP rank (vocab-parallel)."""
    return 2 * m.hidden * padded_vocab(m, layout.tp, "megatron") / layout.tp


def _merge(parts: list[DeviceWork], scale: float) -> DeviceWork:
    """The work of a device holding ``parts`` (each field summed in order, times ``scale``)."""
    if len(parts) == 1 and scale == 1.0:  # 1.0 * (0 + x) is x
        return parts[0]
    columns = zip(*map(_FIELDS, parts), strict=True)
    return DeviceWork(*(scale * sum(col) for col in columns))


_FIELDS = attrgetter(*DeviceWork.__dataclass_fields__)
