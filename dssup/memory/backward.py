"""What one backward adds on top of the stored activations, once per device and micro-batch.

Only one backward runs at a time on a device, so these bytes are counted once, not per
in-flight micro-batch, and the largest one among the stages a device holds is what counts:

* **the loss's backward** (last stage, and each MTP module's loss): a fused, vocab-parallel
  cross-entropy (Megatron) turns its FP32 softmax into the gradient in place and casts it to the
  compute dtype (A*s*v/t more); an unfused one (transformers' ``ForCausalLMLoss``:
  ``cross_entropy(logits.float(), ...)``) holds the FP32 log-softmax and two FP32 gradients at
  the start of backward: 8*s*v/t more than what it stored;
* **a recomputed layer**: with full recompute the checkpointed unit (``recompute_num_layers``
  layers with Megatron's uniform method, one layer with block or Hugging Face gradient
  checkpointing) is re-forwarded before its backward, so its activations exist once more;
  with selective recompute, one layer's recomputed modules;
* **a layer's backward temporaries**: the gradients of its largest intermediates while they are
  still stored. In the SwiGLU backward (``down(act(gate) * up)``) the gradients of the product,
  of act and of up coexist with gate, act and up once the product is freed: 2 more FFN-sized
  tensors, plus two hidden-sized gradients (measured on CPU with MemTracker for transformers'
  Llama: 3*A*f + 2*R*h of temporaries per token, exactly); attention's backward holds the
  gradients of q, k and v, or of the probabilities and scores when they are stored.
"""

from __future__ import annotations

from dssup.memory.activations import Ctx, Term, keep
from dssup.memory.config import Recompute

__all__ = ["layer_temporaries", "loss_backward", "recomputed_unit"]


def loss_backward(c: Ctx) -> int:
    """Per-sample bytes the loss's backward adds at its start (last stage)."""
    if c.conv == "paper" or c.r is None:
        return 0
    v, s, t = c.vocab, c.s, c.t
    if c.r.loss == "unfused":
        return 8 * s * v // t
    return (c.act if c.act != 4 else 0) * s * v // t


def recomputed_unit(c: Ctx, layer: list[Term], rc: Recompute, unit: int) -> int:
    """Per-sample bytes of one recomputed unit while its backward runs (0 without recompute)."""
    if rc == "none" or c.conv == "paper":
        return 0
    gone = sum(x.bytes for x in layer if not keep(x.group, rc, c))
    return gone * (unit if rc == "full" else 1)


def _ffn_temporaries(c: Ctx, moe_layer: bool) -> float:
    """Per-token FFN backward bytes above what the FFN stores (two FFN-sized gradients)."""
    moe, a = c.m.moe, c.act
    if not moe_layer or moe is None:
        return 2 * a * c.m.ffn / c.t
    slots = c.imbalance * c.etp * moe.top_k / c.seq
    experts = 2 * a * moe.expert_ffn / c.etp * slots
    if c.eager:  # transformers' grouped experts also hold the gradient of their sorted copy
        experts += a * c.m.hidden * slots
    shared = 2 * a * moe.n_shared * moe.shared_ffn / c.t
    return max(experts, shared)


def _attention_temporaries(c: Ctx) -> float:
    """Per-token attention backward bytes: gradients of q, k, v (flash), or of the stored
    probabilities and of the scores (unfused attention, math SDPA)."""
    m, nh, t = c.m, c.m.heads, c.t
    if m.mla is not None:
        dq, dv, kv = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim, m.mla.v_head_dim, nh
    else:
        dq, dv, kv = m.head_dim, m.head_dim, m.kv_heads
    kind = "flash" if c.r is None else c.r.attention
    if kind == "flash" or (kind in ("sdpa", "sdpa-cpu") and not _math(c)):
        return c.act * (nh * dq + kv * (dq + dv)) / t
    per_score = 8 if c.eager else 2 * c.act  # eager softmax runs in FP32
    return per_score * nh * c.s_full / t


def _math(c: Ctx) -> bool:
    from dssup.memory.eager import sdpa_math

    return sdpa_math(c)


def layer_temporaries(c: Ctx, moe_layer: bool, ffn_stored: int) -> int:
    """Per-sample bytes a layer's backward holds above its stored activations. The FFN's
    backward runs first; attention's runs once the FFN's stored tensors (``ffn_stored``
    per-sample bytes) are freed."""
    if c.conv == "paper" or c.r is None:
        return 0
    hidden = 2 * (c.act if not c.eager else c.r.precision.weights) * c.m.hidden / c.seq
    ffn = _ffn_temporaries(c, moe_layer) * c.s
    attention = _attention_temporaries(c) * c.s - ffn_stored
    return int(max(ffn, attention) + hidden * c.s) + 1
