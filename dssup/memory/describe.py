"""The architecture a config was read as, in words, for the assumptions of every estimate.

A reader checking an estimate must see what dssup took the model to be (a 2-matrix GELU MLP or
SwiGLU, LayerNorm or RMSNorm, a tied head or not) next to the number it produced; only what
applies is said (no MLA words for a Llama, no expert words for a dense model).
"""

from __future__ import annotations

from functools import lru_cache

from dssup.memory.spec import ModelSpec

__all__ = ["architecture_lines"]


def _attention(m: ModelSpec) -> str:
    if m.mla is not None:
        a = m.mla
        out = f"MLA {m.heads} heads (q_lora {a.q_lora_rank or 'none'}, kv_lora {a.kv_lora_rank})"
    elif m.kv_heads == m.heads:
        out = f"MHA {m.heads} heads of {m.head_dim}"
    else:
        out = f"GQA {m.heads} query / {m.kv_heads} KV heads of {m.head_dim}"
    extras = [
        "q/k/v biases" if m.qkv_bias else "",
        "output-projection bias" if m.attn_out_bias else "",
        {"none": "", "head": "per-head q/k norms", "full": "full-width q/k norms"}[m.qk_norm],
        "attention sinks" if m.attn_sinks else "",
    ]
    extra = ", ".join(e for e in extras if e)
    return f"{out}{' with ' + extra if extra else ''}"


def _mlp(m: ModelSpec) -> str:
    kind = (
        f"gated {m.activation} MLP (3 matrices; backward keeps 4 h_F-wide tensors per token)"
        if m.mlp_kind == "gated"
        else f"2-matrix {m.activation} MLP (backward keeps 2 h_F-wide tensors per token)"
    )
    kind += " with biases" if m.mlp_bias else ""
    moe = m.moe
    if moe is None:
        return kind
    shared = f" + {moe.n_shared} shared of {moe.shared_ffn}" if moe.n_shared else ""
    dense = f", {m.layers - m.moe_layer_count} dense layers" if m.moe_layer_count < m.layers else ""
    bias = ", expert biases" if moe.expert_bias else ""
    return f"MoE {moe.n_routed} routed experts of {moe.expert_ffn} (top {moe.top_k}){shared}{bias}{dense}; {kind}"


def _block(m: ModelSpec) -> str:
    norm = "LayerNorm" if m.norm_kind == "layer" else "RMSNorm"
    norm += " with bias" if m.norm_bias else ""
    layout = "parallel attention+MLP" if m.parallel_block else "sequential attention, MLP"
    return f"{norm} x{m.layer_norms} per layer, {layout}"


def _head(m: ModelSpec) -> str:
    head = "output head tied to the embedding" if m.tie_embeddings else "separate output head"
    head += " with bias" if m.head_bias else ""
    if m.learned_positions:
        head += f", learned position embedding of {m.learned_positions}"
    return head


@lru_cache(maxsize=256)
def architecture_lines(m: ModelSpec) -> tuple[str, ...]:
    """One line for the architecture as read, one for a sliding window, and the reading notes
    (cached: the planner meets one model thousands of times)."""
    out = [f"architecture: {_attention(m)}; {_mlp(m)}; {_block(m)}; {_head(m)}"]
    if m.sliding_window:
        out.append(
            f"sliding window {m.sliding_window} on {m.sliding_layers} of {m.layers} layers: no "
            "change to stored bytes (eager attention still materialises masked s^2 scores; "
            "flash attention stores none)"
        )
    return (*out, *m.notes)
