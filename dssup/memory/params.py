"""Parameters per module and per GPU, following section 3-4 of the spec.

Counts are per GPU of a stage, after tensor/expert parallel splitting and before ZeRO. The
``paper`` convention replicates W_QR and shared experts across TP ranks (as the paper does);
``megatron`` splits both with TP, as Megatron-core and DeepSeek's own code do.
"""

from __future__ import annotations

from dataclasses import dataclass

from dssup.memory.config import Convention, Layout
from dssup.memory.spec import ModelSpec

__all__ = ["Split", "attention_params", "mlp_params", "model_total", "moe_params", "norm_params"]


@dataclass(frozen=True, slots=True)
class Split:
    """Parameters of one module on one GPU: ``non_moe`` sharded over DP, ``moe`` over EDP."""

    non_moe: int = 0
    moe: int = 0

    def __add__(self, other: Split) -> Split:
        return Split(self.non_moe + other.non_moe, self.moe + other.moe)

    def scale(self, n: int) -> Split:
        return Split(self.non_moe * n, self.moe * n)

    @property
    def total(self) -> int:
        return self.non_moe + self.moe


def norm_params(m: ModelSpec) -> int:
    """RMSNorm weights of one layer (attention + FFN norms, MLA's q_norm and kv_norm)."""
    if m.mla is None:
        return 2 * m.hidden
    return 2 * m.hidden + m.mla.q_lora_rank + m.mla.kv_lora_rank


def attention_params(m: ModelSpec, tp: int, conv: Convention) -> int:
    """Attention projection weights of one layer on one TP rank."""
    h, nh = m.hidden, m.heads
    if m.mla is None:
        d, kv = m.head_dim, m.kv_heads
        weights = h * nh * d * 2 + 2 * h * kv * d
        bias = nh * d + 2 * kv * d if m.qkv_bias else 0
        return (weights + bias) // tp
    a = m.mla
    uk_uv_o = nh * a.qk_nope_head_dim * a.kv_lora_rank + nh * a.v_head_dim * (a.kv_lora_rank + h)
    down = a.kv_lora_rank * h + a.qk_rope_head_dim * h  # W_DKV, W_KR: never split
    if a.q_lora_rank == 0:  # W_Q [n_h(d_h+d_hr), h], split with the heads
        wq = nh * (a.qk_nope_head_dim + a.qk_rope_head_dim) * h
        return (wq + uk_uv_o) // tp + down
    w_uq = nh * a.qk_nope_head_dim * a.q_lora_rank
    w_qr = nh * a.qk_rope_head_dim * a.q_lora_rank
    down += a.q_lora_rank * h  # W_DQ
    if conv == "paper":
        return (w_uq + uk_uv_o) // tp + down + w_qr
    return (w_uq + w_qr + uk_uv_o) // tp + down


def mlp_params(m: ModelSpec, tp: int) -> int:
    """Dense SwiGLU MLP of one layer on one TP rank."""
    return 3 * m.hidden * m.ffn // tp


def moe_params(m: ModelSpec, layout: Layout, conv: Convention) -> Split:
    """One MoE layer on one GPU: routed experts split over EP (and ETP), router replicated."""
    moe = m.moe
    if moe is None:
        return Split()
    h = m.hidden
    routed = moe.n_routed // layout.ep * 3 * h * moe.expert_ffn // layout.etp
    shared = moe.n_shared * 3 * h * moe.shared_ffn + (h if moe.shared_gate else 0)
    router = moe.n_routed * h
    if conv == "paper":  # the paper shards routed, shared experts and router over EDP
        return Split(moe=routed + shared + router)
    bias = moe.n_routed if moe.router_bias else 0
    return Split(non_moe=shared // layout.tp + router + bias, moe=routed)


def embedding_params(m: ModelSpec, tp: int, vocab: int) -> int:
    """Vocabulary-parallel embedding (or head) on one TP rank."""
    return vocab * m.hidden // tp


def model_total(m: ModelSpec, conv: Convention = "paper", mtp: bool = False) -> int:
    """Whole-model parameter count (TP = EP = 1). ``paper`` counts no final norm and no MTP."""
    one = Layout()
    total = m.layers * (norm_params(m) + attention_params(m, 1, conv))
    for i in range(m.layers):
        total += moe_params(m, one, conv).total if m.is_moe_layer(i) else mlp_params(m, 1)
    total += m.vocab * m.hidden * (1 if m.tie_embeddings else 2)
    if conv == "megatron":
        total += m.hidden  # final norm
    if mtp and m.mtp_depth:
        total += m.mtp_depth * mtp_block_params(m, one, conv, 1).total
    return total


def mtp_block_params(m: ModelSpec, layout: Layout, conv: Convention, tp: int) -> Split:
    """One multi-token-prediction module: a transformer block (MoE FFN when the model has
    experts), the [h, 2h] projection and two RMSNorms; it shares embedding and head."""
    block = Split(non_moe=norm_params(m) + attention_params(m, tp, conv) + 2 * m.hidden)
    block += Split(non_moe=2 * m.hidden * m.hidden // tp)
    if m.moe is not None:
        return block + moe_params(m, layout, conv)
    return block + Split(non_moe=mlp_params(m, tp))
