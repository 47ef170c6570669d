"""Activation bytes stored for backward, per sample (b = 1), as named terms with a group each.

Every term is linear in the micro-batch b (the paper's E_token = b*s*N_r/N included), so the
estimator multiplies per-sample bytes by b and the planner evaluates thousands of micro-batch
sizes without recomputing terms. The group of a term decides what recomputation drops:

* ``full`` keeps only ``input`` (the checkpointed layer input) and ``route`` (the paper keeps
  the routing map so recompute routes identically) plus stage-level ``io`` terms;
* ``selective`` in the paper drops RMSNorm outputs, MLA up-projections, core attention and the
  SwiGLU activations; otherwise it drops the groups of Megatron's ``--recompute-modules``
  (``MODULE_GROUPS``, Megatron-core ``TransformerConfig.recompute_modules``).

Bytes per element come from the configured precision: ``A`` for tensors in the compute dtype
(BF16 2, FP32 4), ``L`` for linear-layer inputs (and MoE SwiGLU inputs) that FP8 training caches
at one byte plus one FP32 scale per 1x128 tile (arXiv 2412.19437, section 3.3), 4 for what stays
FP32 (router logits, softmax statistics, logits for the loss). The ``paper`` convention folds
BF16 into its coefficients and scales them by A/2. The ``megatron`` convention's terms follow
Megatron/TransformerEngine kernels; ``framework`` transformers/deepspeed use ``eager.py``.
"""

from __future__ import annotations

from dssup.memory.ffn_terms import (
    dense_terms,
    ffn_head,
    mlp_tensors,
    moe_terms,
    post_norm_terms,
)
from dssup.memory.terms import (
    FP8_TILE,
    FULL_KEEP,
    MODULE_GROUPS,
    PAPER_SELECTIVE,
    Ctx,
    Term,
    dropped,
    keep,
    term,
)

__all__ = [
    "FP8_TILE",
    "FULL_KEEP",
    "MODULE_GROUPS",
    "PAPER_SELECTIVE",
    "Ctx",
    "Term",
    "dropped",
    "ffn_head",
    "keep",
    "layer_terms",
    "mlp_tensors",
    "stage_io_terms",
    "term",
]


def _core_attention(c: Ctx, prefix: str) -> list[Term]:
    nh, t, a = c.m.heads, c.t, c.act
    if c.flash:  # fused attention keeps only the FP32 log-sum-exp per query and head
        return [term(f"{prefix}.softmax_lse", "core_attn", 4 * nh * c.s / t)]
    if c.conv == "paper":
        scores = (5 if c.dropout else 2) * nh * c.s * c.s_full / t * a / 2
        return [term(f"{prefix}.softmax_scores", "core_attn", scores)]
    # Megatron's unfused core attention: the softmax output in the compute dtype, plus the
    # dropout mask and the dropped-out probabilities when dropout is on.
    per = (a + (1 + a) * c.dropout) * nh * c.s * c.s_full / t
    return [term(f"{prefix}.softmax_scores", "core_attn", per)]


def _mla_terms(c: Ctx) -> list[Term]:
    a, h, nh, t, s = c.m.mla, c.m.hidden, c.m.heads, c.t, c.s
    assert a is not None  # guarded by the caller; not input validation
    latent = a.q_lora_rank + a.kv_lora_rank
    k, lin = c.act / 2, c.lin
    if c.conv == "paper":
        terms = [
            term("attn.input", "input", 2 * s * h / c.seq * k),
            term("attn.norm_out", "norm", 2 * s * h / c.seq * k),
            term("attn.latents", "latent", 2 * s * latent * k),
        ]
    else:  # q_norm/kv_norm outputs (the up-projections' inputs) and the RoPE key are stored
        terms = [
            term("attn.input", "input", c.act * s * h / c.seq),
            term("attn.norm_out", "norm", lin * s * h / c.seq),
            term("attn.latents", "latent", c.act * s * latent),
            term("attn.latents_norm_out", "latent_norm", lin * s * latent),
            term("attn.k_rope", "latent", c.act * s * a.qk_rope_head_dim),
        ]
    terms += [
        term("attn.qk", "up_proj", 4 * s * (a.qk_nope_head_dim + a.qk_rope_head_dim) * nh / t * k),
        term("attn.v", "up_proj", 2 * s * a.v_head_dim * nh / t * k),
        *_core_attention(c, "attn"),
        term("attn.out", "attn_out", 2 * s * a.v_head_dim * nh / t * k),
    ]
    if _fp8_out_copy(c):
        terms.append(term("attn.out_fp8", "attn_out", lin * s * a.v_head_dim * nh / t))
    if c.dropout:
        terms.append(term("attn.dropout_mask", "dropout", s * h / c.seq))
    return terms


def _fp8_out_copy(c: Ctx) -> bool:
    """TransformerEngine keeps the attention output twice with FP8: BF16 for the attention
    backward, FP8 for the output projection. DeepSeek keeps one E5M6 copy for both (counted
    at 2 bytes: the report gives no packing)."""
    return c.conv == "megatron" and c.lin != c.act and not c.deepseek


def _gqa_terms(c: Ctx) -> list[Term]:
    m, h, t, s = c.m, c.m.hidden, c.t, c.s
    d, k = m.head_dim, c.act / 2
    norm_out = 2 * k if c.conv == "paper" else c.lin
    terms = [
        term("attn.input", "input", 2 * s * h / c.seq * k),
        term("attn.norm_out", "norm", norm_out * s * h / c.seq),
        term("attn.q", "up_proj", 2 * s * m.heads * d / t * k),
        term("attn.kv", "latent", 4 * s * m.kv_heads * d / t * k),
        *_qk_norm_terms(c),
        *_core_attention(c, "attn"),
        term("attn.out", "attn_out", 2 * s * m.heads * d / t * k),
        *post_norm_terms(c, "attn"),
    ]
    if _fp8_out_copy(c):
        terms.append(term("attn.out_fp8", "attn_out", c.lin * s * m.heads * d / t))
    if c.dropout:
        terms.append(term("attn.dropout_mask", "dropout", s * h / c.seq))
    return terms


def _qk_norm_terms(c: Ctx) -> list[Term]:
    """Q/K norms (Qwen3, Gemma-3, OLMo-2) keep their inputs, the projected q and k."""
    m = c.m
    if m.qk_norm == "none":
        return []
    per = c.act * c.s * (m.heads + m.kv_heads) * m.head_dim / c.t
    return [term("attn.qk_norm_input", "norm", per)]


def layer_terms(c: Ctx, moe_layer: bool) -> list[Term]:
    """Per-sample activation terms of one transformer layer (cached: layouts that differ only
    in PP or DP share them, which keeps the planner fast)."""
    if c.eager:
        from dssup.memory.eager import eager_layer_terms

        return eager_layer_terms(c, moe_layer)
    terms = _mla_terms(c) if c.m.mla is not None else _gqa_terms(c)
    if moe_layer:
        terms += moe_terms(c)
    else:
        terms += dense_terms(c)
    return terms + post_norm_terms(c, "mlp")


def stage_io_terms(c: Ctx, first: bool, last: bool, mtp_terms: list[Term]) -> list[Term]:
    """First stage: token ids. Last stage: final norm, the loss's FP32 tensors, MTP."""
    if c.conv == "paper":
        return []
    if c.eager:
        from dssup.memory.eager import eager_io_terms

        return eager_io_terms(c, first, last)
    h, s = c.m.hidden, c.s
    out: list[Term] = []
    if first:
        out.append(term("embed.token_ids", "io", 8 * s))
    if last:
        out += [
            term("head.norm", "io", (c.act + c.lin) * s * h / c.seq),
            term("head.logits_fp32", "io", 4 * s * c.vocab / c.t),
        ]
        for depth in range(c.m.mtp_depth):
            p = f"mtp{depth}"
            out += [term(f"{p}.{x.name}", x.group, x.bytes) for x in mtp_terms]
            out += [
                term(f"{p}.norms_and_concat", "io", 6 * c.act * s * h / c.seq),
                term(f"{p}.logits_fp32", "io", 4 * s * c.vocab / c.t),
            ]
    return out
