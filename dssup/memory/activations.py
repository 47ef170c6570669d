"""Activation bytes stored for backward, per sample (b = 1), as named terms with a group each.

Every term is linear in the micro-batch b (the paper's E_token = b*s*N_r/N included), so the
estimator multiplies per-sample bytes by b and the planner evaluates thousands of micro-batch
sizes without recomputing terms. The group of a term decides what recomputation drops:

* ``full`` keeps only ``input`` (the checkpointed layer input) and ``route`` (the paper keeps
  the routing map so recompute routes identically) plus stage-level ``io`` terms;
* ``selective`` drops ``norm`` outputs, MLA/GQA ``up_proj``, ``core_attn`` and SwiGLU ``act``
  (DeepSeek-V3 recomputes RMSNorms and MLA up-projections; Megatron ``--recompute-modules
  layernorm,mla_up_proj,core_attn,moe_act``).
Terms follow spec section 6: the ``paper`` convention reproduces its formulas, ``megatron``
fixes what they leave out (per-rank expert tokens, flash attention, logits, MTP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dssup.memory.config import Convention, Recompute
from dssup.memory.profile import EagerProfile
from dssup.memory.spec import ModelSpec
from dssup.memory.traced import TracedProfile

__all__ = ["Ctx", "Term", "keep", "layer_terms", "stage_io_terms", "term"]

FULL_KEEP = frozenset({"input", "route", "io"})
SELECTIVE_DROP = frozenset({"norm", "up_proj", "core_attn", "act"})


@dataclass(frozen=True, slots=True)
class Term:
    name: str
    group: str
    bytes: int  # per sample (b = 1), rounded up to whole bytes


@dataclass(frozen=True, slots=True)
class Ctx:
    """Everything a term formula needs, resolved once per estimate."""

    m: ModelSpec
    conv: Convention
    t: int  # tensor parallel
    seq: int  # divisor of sequence-sharded (norm/dropout) regions: t with SP, else 1
    s: int  # local sequence length (s / cp)
    s_full: int  # keys attended to (s)
    flash: bool
    dropout: bool
    ep: int
    etp: int
    imbalance: float
    vocab: int
    profile: EagerProfile | TracedProfile | None = None  # trace-derived (replaces the terms)


def term(name: str, group: str, value: float) -> Term:
    """A term with its per-sample bytes rounded up (so b * bytes never under-counts)."""
    return Term(name, group, math.ceil(value))


def keep(group: str, recompute: Recompute) -> bool:
    """Whether a term of ``group`` stays stored under ``recompute``."""
    if group.startswith("eager:"):  # eager profile terms are measured per recompute level
        return group[6:] == recompute
    if recompute == "full":
        return group in FULL_KEEP
    if recompute == "selective":
        return group not in SELECTIVE_DROP
    return True


def _core_attention(c: Ctx, prefix: str) -> list[Term]:
    nh, t = c.m.heads, c.t
    if c.flash:  # fused attention keeps only the FP32 log-sum-exp per query and head
        return [term(f"{prefix}.softmax_lse", "core_attn", 4 * nh * c.s / t)]
    scores = (5 if c.dropout else 2) * nh * c.s * c.s_full / t
    return [term(f"{prefix}.softmax_scores", "core_attn", scores)]


def _mla_terms(c: Ctx) -> list[Term]:
    a, h, nh, t, s = c.m.mla, c.m.hidden, c.m.heads, c.t, c.s
    assert a is not None  # guarded by the caller; not input validation
    latent = a.q_lora_rank + a.kv_lora_rank
    terms = [
        term("attn.input", "input", 2 * s * h / c.seq),
        term("attn.norm_out", "norm", 2 * s * h / c.seq),
        term("attn.latents", "latent", 2 * s * latent),
    ]
    if c.conv == "megatron":  # q_norm/kv_norm outputs and the shared RoPE key are stored too
        terms.append(term("attn.latents_norm_out", "norm", 2 * s * latent))
        terms.append(term("attn.k_rope", "latent", 2 * s * a.qk_rope_head_dim))
    terms += [
        term("attn.qk", "up_proj", 4 * s * (a.qk_nope_head_dim + a.qk_rope_head_dim) * nh / t),
        term("attn.v", "up_proj", 2 * s * a.v_head_dim * nh / t),
        *_core_attention(c, "attn"),
        term("attn.out", "attn_out", 2 * s * a.v_head_dim * nh / t),
    ]
    if c.dropout:
        terms.append(term("attn.dropout_mask", "dropout", s * h / c.seq))
    return terms


def _gqa_terms(c: Ctx) -> list[Term]:
    m, h, t, s = c.m, c.m.hidden, c.t, c.s
    d = m.head_dim
    terms = [
        term("attn.input", "input", 2 * s * h / c.seq),
        term("attn.norm_out", "norm", 2 * s * h / c.seq),
        term("attn.q", "up_proj", 2 * s * m.heads * d / t),
        term("attn.kv", "latent", 4 * s * m.kv_heads * d / t),
        *_core_attention(c, "attn"),
        term("attn.out", "attn_out", 2 * s * m.heads * d / t),
    ]
    if c.dropout:
        terms.append(term("attn.dropout_mask", "dropout", s * h / c.seq))
    return terms


def _ffn_head(c: Ctx, prefix: str) -> list[Term]:
    group = "input" if c.conv == "paper" else "residual"
    h, s = c.m.hidden, c.s
    return [
        term(f"{prefix}.input", group, 2 * s * h / c.seq),
        term(f"{prefix}.norm_out", "norm", 2 * s * h / c.seq),
    ]


def _dense_terms(c: Ctx) -> list[Term]:
    h, f, t, s = c.m.hidden, c.m.ffn, c.t, c.s
    terms = _ffn_head(c, "mlp")
    if c.conv == "paper":  # 4bsh/t + 3bsh + 8bs*h_F/t
        terms.append(term("mlp.fc1_input", "mlp", 3 * s * h))
    terms += [term("mlp.fc1_out", "mlp", 4 * s * f / t), term("mlp.act", "act", 4 * s * f / t)]
    if c.conv == "megatron" and c.dropout:
        terms.append(term("mlp.dropout_mask", "dropout", s * h / c.seq))
    return terms


def _moe_terms_paper(c: Ctx) -> list[Term]:
    moe, h, s = c.m.moe, c.m.hidden, c.s
    assert moe is not None
    n, nr, he = moe.n_routed, moe.top_k, moe.expert_ffn
    routed = s * nr / c.ep  # (N/EP) * E_token with E_token = b*s*N_r/N
    shared = moe.n_shared
    return [
        *_ffn_head(c, "moe"),
        term("moe.router_logits", "router", 4 * s * n),
        term("moe.routing_map", "route", 2 * s * nr),
        term("moe.expert_input", "experts", 3 * routed * h),
        term("moe.expert_fc1", "experts", 4 * routed * he),
        term("moe.expert_act", "act", 4 * routed * he),
        term("moe.shared_input", "experts", 3 * s * h * shared),
        term("moe.shared_fc1", "experts", 4 * s * moe.shared_ffn * shared),
        term("moe.shared_act", "act", 4 * s * moe.shared_ffn * shared),
    ]


def _moe_terms_megatron(c: Ctx) -> list[Term]:
    moe, h, s, t = c.m.moe, c.m.hidden, c.s, c.t
    assert moe is not None
    slots = c.imbalance * c.etp * s * moe.top_k / c.seq  # token-slots this rank processes
    he = moe.expert_ffn / c.etp
    sh = moe.n_shared * moe.shared_ffn / t
    return [
        *_ffn_head(c, "moe"),
        term("moe.router_logits", "router", 4 * s * moe.n_routed / c.seq),
        term("moe.routing_probs", "router", 4 * s * moe.top_k / c.seq),
        term("moe.expert_input", "experts", 2 * slots * h),
        term("moe.expert_output", "experts", 2 * slots * h),
        term("moe.expert_fc1", "experts", 4 * slots * he),
        term("moe.expert_act", "act", 2 * slots * he),
        term("moe.shared_fc1", "experts", 4 * s * sh),
        term("moe.shared_act", "act", 2 * s * sh),
    ]


@lru_cache(maxsize=256)
def layer_terms(c: Ctx, moe_layer: bool) -> list[Term]:
    """Per-sample activation terms of one transformer layer (cached: layouts that differ only
    in PP or DP share them, which keeps the planner fast)."""
    terms = _mla_terms(c) if c.m.mla is not None else _gqa_terms(c)
    if moe_layer:
        terms += _moe_terms_paper(c) if c.conv == "paper" else _moe_terms_megatron(c)
    else:
        terms += _dense_terms(c)
    return terms


def stage_io_terms(c: Ctx, first: bool, last: bool, mtp_terms: list[Term]) -> list[Term]:
    """First stage: token ids. Last stage: final norm, FP32 logits for the loss, MTP (megatron)."""
    if c.conv == "paper":
        return []
    h, s = c.m.hidden, c.s
    out: list[Term] = []
    if first:
        out.append(term("embed.token_ids", "io", 8 * s))
    if last:
        out += [
            term("head.norm", "io", 4 * s * h / c.seq),
            term("head.logits_fp32", "io", 4 * s * c.vocab / c.t),
        ]
        for depth in range(c.m.mtp_depth):
            p = f"mtp{depth}"
            out += [term(f"{p}.{x.name}", x.group, x.bytes) for x in mtp_terms]
            out += [
                term(f"{p}.norms_and_concat", "io", 12 * s * h / c.seq),
                term(f"{p}.logits_fp32", "io", 4 * s * c.vocab / c.t),
            ]
    return out
