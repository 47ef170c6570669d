"""Feed-forward activation terms: the dense MLP and the MoE layer, per convention.

``paper`` reproduces arXiv 2502.07846's formulas (BF16 folded in, scaled by A/2); ``megatron``
follows Megatron-core: a fused SwiGLU keeps its [s, 2f] input (a plain GELU MLP its [s, f] one)
and its output for the second matrix; routed experts are scaled by their probabilities inside
the SwiGLU (``weighted_bias_swiglu``), so no copy of the expert outputs is kept.
"""

from __future__ import annotations

from dssup.memory.spec import ModelSpec
from dssup.memory.terms import Ctx, Term, term

__all__ = ["dense_terms", "ffn_head", "mlp_tensors", "moe_terms", "post_norm_terms"]


def ffn_head(c: Ctx, prefix: str) -> list[Term]:
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


def dense_terms(c: Ctx) -> list[Term]:
    h, f, t, s = c.m.hidden, c.m.ffn, c.t, c.s
    terms = ffn_head(c, "mlp")
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
        *ffn_head(c, "moe"),
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


def moe_terms(c: Ctx) -> list[Term]:
    """One MoE layer's feed-forward terms."""
    return _moe_terms_paper(c) if c.conv == "paper" else _moe_terms_megatron(c)


def post_norm_terms(c: Ctx, prefix: str) -> list[Term]:
    """Gemma-2/3 sandwich norms: the post-attention and post-MLP norms keep their inputs."""
    if c.m.layer_norms < 4:
        return []
    return [term(f"{prefix}.post_norm_input", "norm", c.act * c.s * c.m.hidden / c.seq)]
