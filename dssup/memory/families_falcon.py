"""Falcon, as transformers builds it (``model_type`` falcon) and as tiiuae's own remote code
built it before that (``RefinedWebModel`` for Falcon-7B, ``RefinedWeb`` for Falcon-40B).

The Hub's Falcon repositories shipped the second format until transformers 4.33 took Falcon in;
copies of those files are still what many checkouts hold (dssup's registry ships both), so both
are read exactly, each with its own field names and defaults, and a legacy file says so among
the assumptions.
"""

from __future__ import annotations

from dssup.memory.families import Family, Fields, gelu_block, gpt_sizes
from dssup.memory.hfread import Reader

__all__ = ["FALCON"]


def _falcon_block(
    r: Reader,
    top: Reader | None,
    *,
    layers: int,
    heads: int,
    kv: int,
    ffn: int,
    parallel: bool,
    norms: int,
) -> Fields:
    """Falcon's decoder (transformers' modeling_falcon and tiiuae's modelling_RW): fused QKV,
    exact-GELU 2-matrix MLP, LayerNorm with bias, biases on the linears only with ``bias``."""
    r.refuse_if("alibi", True, "ALiBi Falcon checkpoints are not read yet")
    hidden = r.num("hidden_size", "n_embed")
    f = gpt_sizes(r, hidden, ffn or 4 * hidden, layers, heads, kv)
    f["activation"] = r.text("activation", "gelu")
    bias = r.flag("bias", False)
    gelu_block(f, bias=bias, mlp_bias=bias)
    f.update(parallel_block=parallel, layer_norms=norms if parallel else 2)
    f["tie_embeddings"] = r.tie("falcon", True, top)
    return f


def falcon(r: Reader, top: Reader | None = None) -> Fields:
    heads = r.num("num_attention_heads")
    new_arch, parallel = r.flag("new_decoder_architecture", False), r.flag("parallel_attn", True)
    if new_arch:
        kv = r.num("num_kv_heads", default=heads)
    else:
        kv = 1 if r.flag("multi_query", True) else heads
    norms = r.num("num_ln_in_parallel_attn", default=2 if new_arch else 1)
    ffn = r.num("ffn_hidden_size", default=0, least=0)
    layers = r.num("num_hidden_layers")
    return _falcon_block(r, top, layers=layers, heads=heads, kv=kv, ffn=ffn, parallel=parallel,
                         norms=norms)  # fmt: skip


def refined_web(r: Reader, top: Reader | None = None) -> Fields:
    """tiiuae's Falcon format from before transformers had Falcon (remote code configuration_RW.py
    and modelling_RW.py, transformers_version 4.27.4): ``RefinedWebModel`` (Falcon-7B/1B: one
    LayerNorm when ``parallel_attn``, one K/V head when ``multi_query``) and ``RefinedWeb``
    (Falcon-40B: ``n_head_kv`` K/V groups, ``ln_attn`` and ``ln_mlp``, always parallel). Sizes
    are ``n_layer``/``n_head``; the MLP is 4 x hidden; RWConfig's defaults are false for
    ``multi_query``, ``parallel_attn``, ``bias`` and ``alibi``."""
    mtype = r.get("model_type")
    heads, layers = r.num("n_head", "num_attention_heads"), r.num("n_layer", "num_hidden_layers")
    r.notes.append(
        f"model_type {mtype!r}: tiiuae's pre-transformers Falcon format (modelling_RW.py), read "
        "as that code builds it (n_layer, n_head, n_head_kv; MLP 4 x hidden)"
    )
    if mtype == "RefinedWeb":
        kv = r.num("n_head_kv", "num_kv_heads")
        return _falcon_block(r, top, layers=layers, heads=heads, kv=kv, ffn=0, parallel=True,
                             norms=2)  # fmt: skip
    for key in ("multi_query", "parallel_attn"):
        if r.get(key) is None:
            r.notes.append(f"{key} absent: RWConfig's default is false")
    kv = 1 if r.flag("multi_query", False) else heads
    return _falcon_block(r, top, layers=layers, heads=heads, kv=kv, ffn=0,
                         parallel=r.flag("parallel_attn", False), norms=1)  # fmt: skip


FALCON: dict[str, Family] = {
    "falcon": falcon,
    "RefinedWebModel": refined_web,
    "RefinedWeb": refined_web,
}
