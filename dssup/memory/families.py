"""How each ``transformers`` model type builds its decoder, read into ``ModelSpec`` fields.

One function per ``model_type``, each reading exactly the fields that type's modeling code
uses, with that code's defaults (transformers 5.23): a GPT-2 MLP is two matrices with biases
and LayerNorm, Gemma ties its head unless told otherwise, Phi has one LayerNorm feeding a
parallel attention and MLP. A family never borrows another's fields, so a config is read
exactly or refused by name (``hf.py``). MoE families live in ``families_moe.py``, Falcon in
``families_falcon.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dssup.memory.hfread import Reader

__all__ = ["DENSE", "Family", "Fields", "base", "every_layer", "gelu_block", "gpt_sizes", "sliding"]

Fields = dict[str, Any]
Family = Callable[[Reader, Reader | None], Fields]


def base(r: Reader, act_key: str = "hidden_act", act: str = "silu") -> Fields:
    """Sizes named as Llama names them (most families)."""
    hidden = r.num("hidden_size")
    heads = r.num("num_attention_heads")
    return {
        "hidden": hidden,
        "ffn": r.num("intermediate_size"),
        "layers": r.num("num_hidden_layers"),
        "heads": heads,
        "kv_heads": r.num("num_key_value_heads", default=heads),
        "head_dim": r.num("head_dim", default=hidden // heads),
        "vocab": r.num("vocab_size"),
        "activation": r.text(act_key, act),
    }


def sliding(r: Reader, layers: int, window: int | None, rule: Callable[[int], bool]) -> Fields:
    """Window and count of sliding-attention layers: ``layer_types`` when given, else the
    type's default ``rule`` over layer indices."""
    if not window:
        return {}
    types = r.get("layer_types")
    if isinstance(types, list) and types:
        count = sum(t == "sliding_attention" for t in types)
    else:
        count = sum(rule(i) for i in range(layers))
    return {"sliding_window": window, "sliding_layers": count} if count else {}


def every_layer(_: int) -> bool:
    """Sliding rule of families that window every layer when a window is set."""
    return True


def _attention_bias(r: Reader, top: Reader | None, family: str, **extra: Any) -> Fields:
    """Llama-style families: ``attention_bias`` on q, k, v and o; untied unless told."""
    f = base(r)
    bias = r.flag("attention_bias", False)
    f.update(qkv_bias=bias, attn_out_bias=bias, tie_embeddings=r.tie(family, False, top), **extra)
    return f


def llama(r: Reader, top: Reader | None = None) -> Fields:
    return _attention_bias(r, top, "llama", mlp_bias=r.flag("mlp_bias", False))


def mistral(r: Reader, top: Reader | None = None) -> Fields:
    f = base(r)
    if "sliding_window" in r.cfg:
        window = r.num("sliding_window", default=0, least=0)  # null: no window
    else:
        window = 4096
        r.notes.append("sliding_window absent: mistral defaults to a 4096-token window")
    f.update(sliding(r, f["layers"], window, every_layer))
    f["tie_embeddings"] = r.tie("mistral", False, top)
    return f


def _qwen_window(r: Reader, layers: int) -> Fields:
    if not r.flag("use_sliding_window", False):
        return {}
    start = r.num("max_window_layers", default=28, least=0)
    window = r.num("sliding_window", default=4096)
    return sliding(r, layers, window, lambda i: i >= start)


def qwen2(r: Reader, top: Reader | None = None) -> Fields:
    f = base(r)
    f.update(qkv_bias=True, tie_embeddings=r.tie("qwen2", False, top))
    f.update(_qwen_window(r, f["layers"]))
    return f


def qwen3(r: Reader, top: Reader | None = None) -> Fields:
    f = _attention_bias(r, top, "qwen3", qk_norm="head")
    f.update(_qwen_window(r, f["layers"]))
    return f


def gemma(r: Reader, top: Reader | None = None, family: str = "gemma") -> Fields:
    f = base(r)
    if family == "gemma":  # GemmaMLP uses hidden_act; its legacy "gelu" means the tanh form
        f["activation"] = r.text("hidden_act", "gelu_pytorch_tanh")
        if f["activation"] == "gelu":
            f["activation"] = "gelu_pytorch_tanh"
            r.notes.append(
                'hidden_act "gelu" read as gelu_pytorch_tanh, as transformers does for Gemma '
                "(a legacy value of the official releases)"
            )
    else:  # Gemma-2/3 read hidden_activation
        f["activation"] = r.text("hidden_activation", "gelu_pytorch_tanh")
    f["head_dim"] = r.num("head_dim", default=256)
    bias = r.flag("attention_bias", False)
    f.update(qkv_bias=bias, attn_out_bias=bias, tie_embeddings=r.tie(family, True, top))
    return f


def gemma2(r: Reader, top: Reader | None = None, family: str = "gemma2") -> Fields:
    f = gemma(r, top, family)
    f["layer_norms"] = 4  # pre/post attention and pre/post feed-forward
    window = r.num("sliding_window", default=4096)
    f.update(sliding(r, f["layers"], window, lambda i: bool((i + 1) % 2)))
    return f


def gemma3_text(r: Reader, top: Reader | None = None) -> Fields:
    f = gemma2(r, top, "gemma3")
    f["qk_norm"] = "head"
    pattern = r.num("sliding_window_pattern", default=6)
    window = r.num("sliding_window", default=4096)
    f.pop("sliding_window", None)
    f.pop("sliding_layers", None)
    f.update(sliding(r, f["layers"], window, lambda i: bool((i + 1) % pattern)))
    return f


def olmo2(r: Reader, top: Reader | None = None) -> Fields:
    return _attention_bias(r, top, "olmo2", qk_norm="full")


def phi3(r: Reader, top: Reader | None = None) -> Fields:
    f = base(r)
    f["tie_embeddings"] = r.tie("phi3", False, top)
    f.update(sliding(r, f["layers"], r.num("sliding_window", default=0, least=0), every_layer))
    return f


def gelu_block(f: Fields, *, bias: bool, mlp_bias: bool) -> Fields:
    """The GPT-style block: two-matrix GELU MLP, LayerNorm with bias."""
    f.update(mlp_kind="plain", norm_kind="layer", norm_bias=True)
    f.update(qkv_bias=bias, attn_out_bias=bias, mlp_bias=mlp_bias)
    return f


def phi(r: Reader, top: Reader | None = None) -> Fields:
    f = gelu_block(base(r, act="gelu_new"), bias=True, mlp_bias=True)
    f.update(layer_norms=1, parallel_block=True, head_bias=True)
    if r.flag("qk_layernorm", False):
        f["qk_norm"] = "head"
    f["tie_embeddings"] = r.tie("phi", False, top)
    return f


def gpt_sizes(r: Reader, hidden: int, ffn: int, layers: int, heads: int, kv: int) -> Fields:
    """Sizes of GPT-style configs that name them their own way (head_dim = h / heads)."""
    return {
        "hidden": hidden,
        "ffn": ffn,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv,
        "head_dim": hidden // heads,
        "vocab": r.num("vocab_size"),
    }


def gpt2(r: Reader, top: Reader | None = None) -> Fields:
    r.refuse_if("add_cross_attention", True, "cross-attention blocks")
    hidden, heads = r.num("n_embd"), r.num("n_head")
    f = gpt_sizes(r, hidden, r.num("n_inner", default=4 * hidden), r.num("n_layer"), heads, heads)
    f["activation"] = r.text("activation_function", "gelu_new")
    f["learned_positions"] = r.num("n_positions", default=1024)
    gelu_block(f, bias=True, mlp_bias=True)
    f["tie_embeddings"] = r.tie("gpt2", True, top)
    return f


def gpt_neox(r: Reader, top: Reader | None = None) -> Fields:
    f = base(r, act="gelu")
    f["kv_heads"] = f["heads"]
    gelu_block(f, bias=r.flag("attention_bias", True), mlp_bias=True)
    f["parallel_block"] = r.flag("use_parallel_residual", True)  # two norms, one input
    f["tie_embeddings"] = r.tie("gpt_neox", False, top)
    return f


def starcoder2(r: Reader, top: Reader | None = None) -> Fields:
    bias = r.flag("use_bias", True)
    f = gelu_block(base(r, act="gelu_pytorch_tanh"), bias=bias, mlp_bias=bias)
    f["tie_embeddings"] = r.tie("starcoder2", True, top)
    f.update(sliding(r, f["layers"], r.num("sliding_window", default=0, least=0), every_layer))
    return f


DENSE: dict[str, Family] = {
    "llama": llama,
    "mistral": mistral,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "gemma": gemma,
    "gemma2": gemma2,
    "gemma3_text": gemma3_text,
    "olmo2": olmo2,
    "phi": phi,
    "phi3": phi3,
    "gpt2": gpt2,
    "gpt_neox": gpt_neox,
    "starcoder2": starcoder2,
}
