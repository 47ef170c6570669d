"""What eager PyTorch modules store for backward: the ``transformers`` framework (and a model
run by DeepSpeed, which is usually one), as Hugging Face transformers 5.x code does it.

Read off transformers 5.23's ``modeling_llama/mixtral/qwen2_moe/deepseek_v2/deepseek_v3`` and
checked tensor by tensor with ``torch.autograd.graph.saved_tensors_hooks`` on CPU (fp32, bf16
and autocast): per token, with R the parameter (residual) dtype and A the compute dtype,

* RMSNorm of width w keeps an FP32 copy of its input (the input itself in FP32), the FP32
  reciprocal RMS and the normalised tensor in its input dtype: (4 + in)*w + 4 bytes;
* a linear layer keeps its input (under autocast one bf16 cast per linear, and autocast's bf16
  weight copy, a batch-independent constant until that layer's backward);
* SwiGLU (``down(act(gate(x)) * up(x))``) keeps gate, act, up and their product: 4*A*f;
* SDPA keeps q, k, v, the output and an FP32 log-sum-exp when q/k/v head dims agree (PyTorch's
  flash kernel), else the math path: FP32 copies of q, k, v and FP32 probabilities (MLA);
  ``eager`` attention keeps q, k and v repeated to every head, the FP32 softmax and its copy in
  the compute dtype, and the output;
* grouped experts keep a sorted copy of their tokens, gate/up, act, product, the expert output,
  an FP32 routing weight and int64 indices per routed token-slot, in R (not autocast);
* the loss keeps the FP32 log-softmax (4*v per token); its backward adds two more FP32 b*s*v
  tensors (``backward.py``).

Full recompute is ``gradient_checkpointing_enable``: one checkpoint per decoder layer, which
keeps that layer's input. There is no selective recompute in these frameworks.
"""

from __future__ import annotations

from dssup.memory.activations import Ctx, Term, term

__all__ = ["autocast", "eager_io_terms", "eager_layer_terms", "sdpa_math"]


def autocast(c: Ctx) -> bool:
    """FP32 parameters with BF16/FP16 compute: torch.autocast."""
    return c.r is not None and c.r.precision.weights != c.act


def _res(c: Ctx) -> int:
    return c.act if c.r is None else c.r.precision.weights


def _norm(
    prefix: str, c: Ctx, width: float, in_bytes: int, group: str = "norm", own_input: bool = False
) -> list[Term]:
    """An RMSNorm: FP32 copy of the input (the input itself when it is FP32), the reciprocal
    RMS and the normalised tensor. ``own_input``: the input is stored nowhere else (else the
    caller counts it, e.g. as the checkpointed layer input, and only the FP32 excess is here)."""
    s = c.s / c.seq
    if c.m.norm_kind == "layer":  # torch's native_layer_norm: its input, FP32 mean and rstd
        own = in_bytes * width if own_input else 0
        return [term(f"{prefix}.stats", group, (own + 8) * s)]
    copy = 4 if own_input else 4 - in_bytes
    return [
        term(f"{prefix}.fp32_input", group, copy * width * s),
        term(f"{prefix}.stats", group, (4 + in_bytes * width) * s),
    ]


def _linear_inputs(c: Ctx, name: str, width: float, consumers: int, group: str) -> Term:
    casts = consumers if autocast(c) else 1
    return term(name, group, c.act * width * casts * c.s / c.seq)


def sdpa_math(c: Ctx) -> bool:
    """The CPU's SDPA falls back to the math path when q/k and v head dims differ (MLA); CUDA's
    takes the memory-efficient kernel there (``sdpa``), which stores no s x s tensor."""
    if c.m.mla is None or c.r is None or c.r.attention != "sdpa-cpu":
        return False
    return c.m.mla.qk_nope_head_dim + c.m.mla.qk_rope_head_dim != c.m.mla.v_head_dim


def _attention(c: Ctx, dq: int, dv: int, kv_heads: int) -> list[Term]:
    nh, s, t, a = c.m.heads, c.s, c.t, c.act
    kind = "sdpa" if c.r is None else c.r.attention
    if kind == "eager":
        probs = (4 + (a if a != 4 else 0)) * nh * s * c.s_full / t
        return [
            term("attn.qkv", "up_proj", a * s * nh * (2 * dq + dv) / t),
            term("attn.probs", "core_attn", probs),
            term("attn.out", "attn_out", a * s * nh * dv / t),
        ]
    if sdpa_math(c):
        return [
            term("attn.qkv_fp32", "up_proj", 4 * s * nh * (2 * dq + dv) / t),
            term("attn.probs_fp32", "core_attn", 4 * nh * s * c.s_full / t),
            term("attn.out", "attn_out", a * s * nh * dv / t),
        ]
    return [
        term("attn.qkv", "up_proj", a * s * (nh * dq + kv_heads * (dq + dv)) / t),
        term("attn.out", "attn_out", a * s * nh * dv / t),
        term("attn.softmax_lse", "core_attn", 4 * nh * s / t),
    ]


def _head(c: Ctx, prefix: str) -> list[Term]:
    """The residual stream entering a norm: the layer input (kept by a checkpoint too). A
    parallel block's MLP reads the attention's input: with one norm nothing more, with two
    only its own norm."""
    r, h = _res(c), c.m.hidden
    if prefix != "attn" and c.m.parallel_block:
        return [] if c.m.layer_norms == 1 else _norm(prefix + ".norm", c, h, r)
    group = "input" if prefix == "attn" else "residual"
    return [term(f"{prefix}.input", group, r * h * c.s / c.seq), *_norm(prefix + ".norm", c, h, r)]


def _mla(c: Ctx) -> list[Term]:
    a = c.m.mla
    assert a is not None  # guarded by the caller; not input validation
    h, act, s = c.m.hidden, c.act, c.s
    terms = [*_head(c, "attn"), _linear_inputs(c, "attn.down_input", h, 2, "norm")]
    if a.q_lora_rank:
        terms += _norm("attn.q_norm", c, a.q_lora_rank, act, "latent", own_input=True)
        terms.append(term("attn.q_up_input", "latent", act * a.q_lora_rank * s))
    terms += _norm("attn.kv_norm", c, a.kv_lora_rank, act, "latent", own_input=True)
    terms.append(term("attn.kv_up_input", "latent", act * a.kv_lora_rank * s))
    dq = a.qk_nope_head_dim + a.qk_rope_head_dim
    return terms + _attention(c, dq, a.v_head_dim, c.m.heads)


def _gqa(c: Ctx) -> list[Term]:
    d, h = c.m.head_dim, c.m.hidden
    kv = c.m.heads if (c.r is not None and c.r.attention == "eager") else c.m.kv_heads
    terms = [*_head(c, "attn"), _linear_inputs(c, "attn.qkv_input", h, 3, "norm")]
    if c.m.qk_norm != "none":  # q and k normalised per head (or full width) before RoPE
        width = (c.m.heads + c.m.kv_heads) * d / c.t
        terms += _norm("attn.qk_norm", c, width, c.act, "up_proj", own_input=True)
    return terms + _attention(c, d, d, kv)


def _swiglu(c: Ctx, prefix: str, width: float, group: str) -> list[Term]:
    """Gated MLP: gate, act, up and their product; a plain (GELU) one: fc1's output and the
    activation's output."""
    tensors = 4 if c.m.mlp_kind == "gated" else 2
    return [term(f"{prefix}.swiglu", group, tensors * c.act * width * c.s / c.seq)]


def _moe(c: Ctx) -> list[Term]:
    moe, h, s, r = c.m.moe, c.m.hidden, c.s, _res(c)
    assert moe is not None
    n, k = moe.n_routed, moe.top_k
    slots = c.imbalance * c.etp * s * k / c.seq
    expert = r if autocast(c) else c.act  # grouped experts do not run under autocast
    consumers = 1 + 2 * bool(moe.n_shared) + moe.shared_gate  # router, shared gate/up, gate
    terms = [*_head(c, "moe"), _linear_inputs(c, "moe.norm_out", h, consumers, "norm")]
    if moe.router_bias:  # DeepSeek-V3: sigmoid scores on an FP32 copy of the input
        fp32_copy = 0 if (r == 4 or autocast(c)) else 4 * h
        router = fp32_copy + 5 * n + 12 * k + 32
    else:
        router = 4 * n + 12 * k + 4
    terms.append(term("moe.router", "router", router * s / c.seq))
    he = moe.expert_ffn / c.etp
    per_slot = expert * (2 * h + 4 * he) + 28
    terms.append(term("moe.experts", "experts", per_slot * slots))
    if moe.n_shared:
        terms += _swiglu(c, "moe.shared", moe.n_shared * moe.shared_ffn / c.t, "shared")
    if moe.shared_gate:
        terms.append(term("moe.shared_gate", "shared", (c.act + 4) * s / c.seq))
    return terms


def eager_layer_terms(c: Ctx, moe_layer: bool) -> list[Term]:
    """Per-sample stored bytes of one decoder layer of an eager implementation."""
    terms = _mla(c) if c.m.mla is not None else _gqa(c)
    if moe_layer:
        return terms + _moe(c)
    h = c.m.hidden
    consumers = 2 if c.m.mlp_kind == "gated" else 1
    terms += [*_head(c, "mlp"), _linear_inputs(c, "mlp.input", h, consumers, "norm")]
    terms += _swiglu(c, "mlp", c.m.ffn / c.t, "mlp")
    if c.m.layer_norms >= 4:  # sandwich norms (Gemma-2/3) after attention and after the MLP
        terms += _norm("attn.post_norm", c, h, c.act, "norm", own_input=True)
        terms += _norm("mlp.post_norm", c, h, c.act, "norm", own_input=True)
    return terms


def eager_io_terms(c: Ctx, first: bool, last: bool) -> list[Term]:
    """Token ids on the first stage; final norm, head input and the FP32 log-softmax (with the
    int64 labels) on the last. Unfused loss only: a fused one keeps 4*v like Megatron's."""
    s, h = c.s, c.m.hidden
    out: list[Term] = []
    if first:
        out.append(term("embed.token_ids", "io", 8 * s))
    if last:
        r = _res(c)
        out.append(term("head.norm_input", "io", r * h * s / c.seq))
        out += [term(x.name, "io", x.bytes) for x in _norm("head.norm", c, h, r)]
        out.append(term("head.input", "io", c.act * h * s / c.seq))
        fused = c.r is not None and c.r.loss == "fused"
        name = "loss.softmax_fp32" if fused else "loss.log_softmax_fp32"
        out.append(term(name, "io", 4 * s * c.vocab / c.t))
        out.append(term("loss.labels", "io", 8 * s))
    return out
