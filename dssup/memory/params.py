"""Parameters per module and per GPU, following section 3-4 of the spec.

Counts are per GPU of a stage, after tensor/expert parallel splitting and before ZeRO. The
``paper`` convention replicates W_QR and shared experts across TP ranks (as the paper does);
``megatron`` splits both with TP, as Megatron-core and DeepSeek's own code do.
"""

from __future__ import annotations

from dataclasses import dataclass

from dssup.memory.config import Convention, Layout
from dssup.memory.spec import ModelSpec

__all__ = [
    "Split",
    "attention_params",
    "final_norm_params",
    "head_extra_params",
    "mlp_params",
    "model_total",
    "moe_params",
    "norm_params",
    "positions_params",
]


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


def _norm(m: ModelSpec, width: int) -> int:
    """One norm over ``width`` elements: a weight, and a bias where the model's norms have one."""
    return width * (2 if m.norm_bias else 1)


def norm_params(m: ModelSpec) -> int:
    """Norm weights of one layer: ``layer_norms`` hidden-size norms (attention + FFN, Gemma's
    sandwich norms), MLA's q_norm and kv_norm, per-head-dim q/k norms (Qwen3, Gemma-3)."""
    out = _norm(m, m.layer_norms * m.hidden)
    if m.mla is not None:
        out += m.mla.q_lora_rank + m.mla.kv_lora_rank
    if m.qk_norm == "head":
        out += 2 * _norm(m, m.head_dim)
    return out


def final_norm_params(m: ModelSpec) -> int:
    """The norm before the output head."""
    return _norm(m, m.hidden)


def attention_params(m: ModelSpec, tp: int, conv: Convention) -> int:
    """Attention projection weights of one layer on one TP rank."""
    h, nh = m.hidden, m.heads
    if m.mla is None:
        d, kv = m.head_dim, m.kv_heads
        weights = h * nh * d * 2 + 2 * h * kv * d
        split = nh * d + 2 * kv * d if m.qkv_bias else 0
        split += nh if m.attn_sinks else 0
        if m.qk_norm == "full":  # OLMo-2: norms over the whole projected q and k, split with heads
            split += _norm(m, nh * d + kv * d)
        return (weights + split) // tp + (h if m.attn_out_bias else 0)
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


def _matrices(m: ModelSpec) -> int:
    """Weight matrices of one MLP: gated (SwiGLU/GeGLU) 3, plain GELU 2."""
    return 3 if m.mlp_kind == "gated" else 2


def mlp_params(m: ModelSpec, tp: int) -> int:
    """Dense MLP of one layer on one TP rank (up/gate column-parallel, down row-parallel: its
    bias is replicated)."""
    weights = _matrices(m) * m.hidden * m.ffn // tp
    if not m.mlp_bias:
        return weights
    return weights + (_matrices(m) - 1) * m.ffn // tp + m.hidden


def moe_params(m: ModelSpec, layout: Layout, conv: Convention) -> Split:
    """One MoE layer on one GPU: routed experts split over EP (and ETP), router replicated."""
    moe = m.moe
    if moe is None:
        return Split()
    h = m.hidden
    one = 3 * h * moe.expert_ffn // layout.etp
    if moe.expert_bias:  # gpt-oss: gate_up bias split with the expert, down bias replicated
        one += 2 * moe.expert_ffn // layout.etp + h
    routed = moe.n_routed // layout.ep * one
    shared = moe.n_shared * 3 * h * moe.shared_ffn + (h if moe.shared_gate else 0)
    router = moe.n_routed * h
    if conv == "paper":  # the paper shards routed, shared experts and router over EDP
        return Split(moe=routed + shared + router)
    bias = moe.n_routed if moe.router_bias else 0
    return Split(non_moe=shared // layout.tp + router + bias, moe=routed)


def embedding_params(m: ModelSpec, tp: int, vocab: int) -> int:
    """Vocabulary-parallel embedding (or head) on one TP rank."""
    return vocab * m.hidden // tp


def positions_params(m: ModelSpec) -> int:
    """Learned absolute position embedding (GPT-2), replicated over TP on the first stage."""
    return m.learned_positions * m.hidden


def head_extra_params(m: ModelSpec, tp: int, vocab: int) -> int:
    """What the last stage holds besides the head matrix: the final norm and a head bias."""
    return final_norm_params(m) + (vocab // tp if m.head_bias else 0)


def model_total(m: ModelSpec, conv: Convention = "paper", mtp: bool = False) -> int:
    """Whole-model parameter count (TP = EP = 1). ``paper`` counts no final norm and no MTP."""
    one = Layout()
    total = m.layers * (norm_params(m) + attention_params(m, 1, conv))
    for i in range(m.layers):
        total += moe_params(m, one, conv).total if m.is_moe_layer(i) else mlp_params(m, 1)
    total += m.vocab * m.hidden * (1 if m.tie_embeddings else 2)
    if conv == "megatron":
        total += head_extra_params(m, 1, m.vocab) + positions_params(m)
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
