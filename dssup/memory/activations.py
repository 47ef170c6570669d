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

import math
from dataclasses import dataclass
from functools import lru_cache

from dssup.memory.config import Convention, Recompute
from dssup.memory.defaults import Resolved
from dssup.memory.profile import EagerProfile
from dssup.memory.spec import ModelSpec

__all__ = [
    "MODULE_GROUPS",
    "Ctx",
    "Term",
    "keep",
    "layer_terms",
    "mlp_tensors",
    "stage_io_terms",
    "term",
]

FULL_KEEP = frozenset({"input", "route", "io"})
PAPER_SELECTIVE = frozenset({"norm", "up_proj", "core_attn", "mlp_act", "moe_act", "shared_act"})
MODULE_GROUPS: dict[str, frozenset[str]] = {
    "core_attn": frozenset({"core_attn"}),
    "layernorm": frozenset({"norm"}),
    "mla_up_proj": frozenset({"up_proj"}),
    "mlp": frozenset({"mlp", "mlp_act"}),
    "moe": frozenset({"router", "experts", "moe_act", "shared", "shared_act"}),
    "moe_act": frozenset({"moe_act"}),
    "shared_experts": frozenset({"shared", "shared_act"}),
}
FP8_TILE = 1 + 4 / 128  # one FP8 byte plus an FP32 scale per 1x128 tile


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
    profile: EagerProfile | None = None  # eager implementation profile (replaces the terms)
    r: Resolved | None = None  # resolved precision and framework (None: convention defaults)

    @property
    def act(self) -> int:
        """Bytes per stored element of the compute dtype."""
        return 2 if self.r is None else self.r.precision.activations

    @property
    def lin(self) -> float:
        """Bytes per cached linear-layer input element (FP8 tiles when cached in FP8)."""
        return FP8_TILE if self.r is not None and self.r.precision.cache_fp8 else self.act

    @property
    def eager(self) -> bool:
        """Eager PyTorch modules (transformers, or a user model under DeepSpeed)."""
        return (
            self.conv == "megatron"
            and self.r is not None
            and self.r.framework in ("transformers", "deepspeed")
        )

    @property
    def deepseek(self) -> bool:
        """DeepSeek-V3's own code (``defaults.py``)."""
        return self.conv == "megatron" and self.r is not None and self.r.framework == "deepseek"


def term(name: str, group: str, value: float) -> Term:
    """A term with its per-sample bytes rounded up (so b * bytes never under-counts)."""
    return Term(name, group, math.ceil(value))


# DeepSeek recomputes every RMSNorm (q/kv norms too) and the SwiGLU of its shared experts.
_DEEPSEEK_EXTRA = {"layernorm": frozenset({"latent_norm"}), "moe_act": frozenset({"shared_act"})}


def dropped(c: Ctx | None) -> frozenset[str]:
    """Groups selective recompute drops under ``c``."""
    if c is None or c.conv == "paper" or c.r is None:
        return PAPER_SELECTIVE
    out: frozenset[str] = frozenset()
    for module in c.r.recompute_modules:
        out |= MODULE_GROUPS[module]
        if c.deepseek:
            out |= _DEEPSEEK_EXTRA.get(module, frozenset())
    return out


def keep(group: str, recompute: Recompute, c: Ctx | None = None) -> bool:
    """Whether a term of ``group`` stays stored under ``recompute`` (selective: the modules of
    ``c``'s settings; the paper's fixed set without ``c``)."""
    if group.startswith("eager:"):  # eager profile terms are measured per recompute level
        return group[6:] == recompute
    if recompute == "full":
        return group in FULL_KEEP
    if recompute == "selective":
        return group not in dropped(c)
    return True


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
        *_post_norm_terms(c, "attn"),
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


def _post_norm_terms(c: Ctx, prefix: str) -> list[Term]:
    """Gemma-2/3 sandwich norms: the post-attention and post-MLP norms keep their inputs."""
    if c.m.layer_norms < 4:
        return []
    return [term(f"{prefix}.post_norm_input", "norm", c.act * c.s * c.m.hidden / c.seq)]


def _ffn_head(c: Ctx, prefix: str) -> list[Term]:
    h, s, k = c.m.hidden, c.s, c.act / 2
    if c.m.parallel_block:  # the MLP reads the attention's input (and, with one norm, its output)
        shared = c.m.layer_norms == 1
        width = 2 * k if c.conv == "paper" else c.lin
        return [] if shared else [term(f"{prefix}.norm_out", "norm", width * s * h / c.seq)]
    if c.conv == "paper":
        return [
            term(f"{prefix}.input", "input", 2 * s * h / c.seq * k),
            term(f"{prefix}.norm_out", "norm", 2 * s * h / c.seq * k),
        ]
    return [
        term(f"{prefix}.input", "residual", c.act * s * h / c.seq),
        term(f"{prefix}.norm_out", "norm", c.lin * s * h / c.seq),
    ]


def mlp_tensors(m: ModelSpec) -> int:
    """h_F-wide tensors an MLP keeps per stage: gated (SwiGLU/GeGLU) 2 (gate and up outputs;
    activation and product), plain GELU 1 (fc1 output; activation output)."""
    return 2 if m.mlp_kind == "gated" else 1


def _dense_terms(c: Ctx) -> list[Term]:
    h, f, t, s = c.m.hidden, c.m.ffn, c.t, c.s
    terms = _ffn_head(c, "mlp")
    if c.conv == "paper":  # 4bsh/t + 3bsh + 8bs*h_F/t
        k, n = c.act / 2, 2 * mlp_tensors(c.m)
        return [
            *terms,
            term("mlp.fc1_input", "mlp", 3 * s * h * k),
            term("mlp.fc1_out", "mlp", n * s * f / t * k),
            term("mlp.act", "mlp_act", n * s * f / t * k),
        ]
    terms += [  # fused SwiGLU keeps its [s, 2f] input (GELU: [s, f]); its output feeds fc2
        term("mlp.fc1_out", "mlp", mlp_tensors(c.m) * c.act * s * f / t),
        term("mlp.act", "mlp_act", c.lin * s * f / t),
    ]
    if c.dropout:
        terms.append(term("mlp.dropout_mask", "dropout", s * h / c.seq))
    return terms


def _moe_terms_paper(c: Ctx) -> list[Term]:
    moe, h, s, k = c.m.moe, c.m.hidden, c.s, c.act / 2
    assert moe is not None
    n, nr, he = moe.n_routed, moe.top_k, moe.expert_ffn
    routed = s * nr / c.ep  # (N/EP) * E_token with E_token = b*s*N_r/N
    shared = moe.n_shared
    return [
        *_ffn_head(c, "moe"),
        term("moe.router_logits", "router", 4 * s * n * k),
        term("moe.routing_map", "route", 2 * s * nr * k),
        term("moe.expert_input", "experts", 3 * routed * h * k),
        term("moe.expert_fc1", "experts", 4 * routed * he * k),
        term("moe.expert_act", "moe_act", 4 * routed * he * k),
        term("moe.shared_input", "experts", 3 * s * h * shared * k),
        term("moe.shared_fc1", "experts", 4 * s * moe.shared_ffn * shared * k),
        term("moe.shared_act", "shared_act", 4 * s * moe.shared_ffn * shared * k),
    ]


def _moe_terms_megatron(c: Ctx) -> list[Term]:
    moe, h, s, t, a, lin = c.m.moe, c.m.hidden, c.s, c.t, c.act, c.lin
    assert moe is not None
    slots = c.imbalance * c.etp * s * moe.top_k / c.seq  # token-slots this rank processes
    he = moe.expert_ffn / c.etp
    sh = moe.n_shared * moe.shared_ffn / t
    terms = [
        term("moe.input", "residual", a * s * h / c.seq),
        term("moe.norm_out", "norm", a * s * h / c.seq),  # the router's input, never FP8
        term("moe.router_logits", "router", 4 * s * moe.n_routed / c.seq),
        term("moe.routing_probs", "router", 4 * s * moe.top_k / c.seq),
        term("moe.expert_input", "experts", lin * slots * h),
        # Megatron-core scales by the routing probabilities inside the SwiGLU (weighted
        # activation), so the probabilities' gradient needs no copy of the expert outputs.
        term("moe.permuted_probs", "experts", 4 * slots),
        term("moe.expert_fc1", "experts", 2 * lin * slots * he),
        term("moe.expert_act", "moe_act", lin * slots * he),
    ]
    if sh:
        if lin != a:  # the shared experts' FP8 copy of their input
            terms.append(term("moe.shared_input", "shared", lin * s * h / c.seq))
        terms.append(term("moe.shared_fc1", "shared", 2 * lin * s * sh))
        terms.append(term("moe.shared_act", "shared_act", lin * s * sh))
    return terms


@lru_cache(maxsize=256)
def layer_terms(c: Ctx, moe_layer: bool) -> list[Term]:
    """Per-sample activation terms of one transformer layer (cached: layouts that differ only
    in PP or DP share them, which keeps the planner fast)."""
    if c.eager:
        from dssup.memory.eager import eager_layer_terms

        return eager_layer_terms(c, moe_layer)
    terms = _mla_terms(c) if c.m.mla is not None else _gqa_terms(c)
    if moe_layer:
        terms += _moe_terms_paper(c) if c.conv == "paper" else _moe_terms_megatron(c)
    else:
        terms += _dense_terms(c)
    return terms + _post_norm_terms(c, "mlp")


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
