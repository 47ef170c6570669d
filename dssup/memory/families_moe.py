"""Mixture-of-experts model types (and MLA), read as ``transformers`` builds them.

Mixtral and Qwen-MoE routers carry no bias; gpt-oss puts biases on its router and on every
expert, plus attention sinks and biased attention projections; DeepSeek V2/V3 use MLA and
shared experts behind the first ``first_k_dense_replace`` dense layers. ``generic`` is not a
model type: it is the field-name reading dssup used before families existed, offered only as an
explicit approximation (``--approximate-as generic``, Megatron arguments in admission).
"""

from __future__ import annotations

from dssup.errors import ConfigError
from dssup.memory.families import DENSE, Family, Fields, base, every_layer, sliding
from dssup.memory.families_falcon import FALCON
from dssup.memory.hfread import Reader
from dssup.memory.spec import MLASpec, MoESpec

__all__ = ["FAMILIES", "GENERIC"]


def mixtral(r: Reader, top: Reader | None = None) -> Fields:
    f = base(r)
    f.update(sliding(r, f["layers"], r.num("sliding_window", default=0, least=0), every_layer))
    f["moe"] = MoESpec(
        n_routed=r.num("num_local_experts"),
        n_shared=0,
        top_k=r.num("num_experts_per_tok"),
        expert_ffn=f["ffn"],
        shared_ffn=f["ffn"],  # unused without shared experts (kept as the generic reader had it)
    )
    f["tie_embeddings"] = r.tie("mixtral", False, top)
    return f


def _qwen_moe(r: Reader, shared: bool) -> MoESpec:
    shared_ffn = r.num("shared_expert_intermediate_size", default=0, least=0) if shared else 0
    expert_ffn = r.num("moe_intermediate_size")
    return MoESpec(
        n_routed=r.num("num_experts"),
        n_shared=1 if shared_ffn else 0,
        top_k=r.num("num_experts_per_tok"),
        expert_ffn=expert_ffn,
        shared_ffn=shared_ffn or expert_ffn,
        shared_gate=bool(shared_ffn),
        every=r.num("decoder_sparse_step", default=1),
        dense_layers=r.int_list("mlp_only_layers"),
    )


def qwen2_moe(r: Reader, top: Reader | None = None) -> Fields:
    f = DENSE["qwen2"](r, top)
    f["qkv_bias"] = r.flag("qkv_bias", True)
    f["moe"] = _qwen_moe(r, shared=True)
    return f


def qwen3_moe(r: Reader, top: Reader | None = None) -> Fields:
    f = DENSE["qwen3"](r, top)
    f["moe"] = _qwen_moe(r, shared=False)
    return f


def _mla(r: Reader, f: Fields) -> Fields:
    mla = MLASpec(
        q_lora_rank=r.num("q_lora_rank", default=0, least=0),
        kv_lora_rank=r.num("kv_lora_rank"),
        qk_nope_head_dim=r.num("qk_nope_head_dim"),
        qk_rope_head_dim=r.num("qk_rope_head_dim", least=0),
        v_head_dim=r.num("v_head_dim"),
    )
    # transformers' DeepSeek configs set head_dim to the rope part (unused by MLA's sizes)
    return {
        "kv_heads": f["heads"],
        "mla": mla,
        "attention": "mla",
        "head_dim": mla.qk_rope_head_dim or f["head_dim"],
    }


def _deepseek(r: Reader, top: Reader | None, family: str) -> Fields:
    r.refuse_if("attention_bias", True, "biased MLA projections")
    r.refuse_if("mlp_bias", True, "biased MLP projections")
    freq = r.num("moe_layer_freq", default=1)
    if freq != 1:
        raise ConfigError(
            f"{r.where}:moe_layer_freq", f"{freq} is not modelled (transformers uses 1)", ""
        )
    f = base(r)
    f.update(_mla(r, f))
    expert_ffn = r.num("moe_intermediate_size")
    f["moe"] = MoESpec(
        n_routed=r.num("n_routed_experts"),
        n_shared=r.num("n_shared_experts", default=0, least=0),
        top_k=r.num("num_experts_per_tok"),
        expert_ffn=expert_ffn,
        shared_ffn=expert_ffn,
        router_bias=r.get("topk_method") == "noaux_tc" or r.get("scoring_func") == "sigmoid",
        first_dense=r.num("first_k_dense_replace", default=0, least=0),
    )
    f["mtp_depth"] = r.num("num_nextn_predict_layers", default=0, least=0)
    f["tie_embeddings"] = r.tie(family, False, top)
    return f


def deepseek_v2(r: Reader, top: Reader | None = None) -> Fields:
    return _deepseek(r, top, "deepseek_v2")


def deepseek_v3(r: Reader, top: Reader | None = None) -> Fields:
    return _deepseek(r, top, "deepseek_v3")


def gpt_oss(r: Reader, top: Reader | None = None) -> Fields:
    f = base(r)
    bias = r.flag("attention_bias", True)
    f.update(qkv_bias=bias, attn_out_bias=bias, attn_sinks=True)
    f["moe"] = MoESpec(
        n_routed=r.num("num_local_experts"),
        n_shared=0,
        top_k=r.num("num_experts_per_tok", "experts_per_token"),
        expert_ffn=f["ffn"],
        shared_ffn=f["ffn"],
        router_bias=True,
        expert_bias=True,
    )
    window = r.num("sliding_window", default=128)
    f.update(sliding(r, f["layers"], window, lambda i: bool((i + 1) % 2)))
    f["tie_embeddings"] = r.tie("gpt_oss", False, top)
    return f


def generic(r: Reader, top: Reader | None = None) -> Fields:
    """Sizes by field name as a SwiGLU/RMSNorm decoder (Llama/DeepSeek style): MLA when
    ``kv_lora_rank`` is set, experts when an expert count is set."""
    f = base(r)
    if r.get("kv_lora_rank") is not None:
        f.update(_mla(r, f))
    f["qkv_bias"] = bool(r.get("attention_bias"))
    keys = [k for k in ("n_routed_experts", "num_local_experts", "num_experts") if r.get(k)]
    if keys:
        shared = r.num("shared_expert_intermediate_size", default=0, least=0)
        expert_ffn = r.num("moe_intermediate_size", default=f["ffn"])
        step = "decoder_sparse_step" if "decoder_sparse_step" in r.cfg else "moe_layer_freq"
        f["moe"] = MoESpec(
            n_routed=r.num(keys[0]),
            n_shared=1 if shared else r.num("n_shared_experts", default=0, least=0),
            top_k=r.num("num_experts_per_tok"),
            expert_ffn=expert_ffn,
            shared_ffn=shared or expert_ffn,
            shared_gate=bool(shared),
            router_bias=r.get("topk_method") == "noaux_tc" or r.get("scoring_func") == "sigmoid",
            first_dense=r.num("first_k_dense_replace", default=0, least=0),
            every=r.num(step, default=1, least=0) or 1,
            dense_layers=r.int_list("mlp_only_layers"),
        )
    f["mtp_depth"] = r.num("num_nextn_predict_layers", default=0, least=0)
    f["tie_embeddings"] = r.tie("generic", False, top)
    return f


GENERIC: Family = generic

FAMILIES: dict[str, Family] = {
    **DENSE,
    **FALCON,
    "mixtral": mixtral,
    "qwen2_moe": qwen2_moe,
    "qwen3_moe": qwen3_moe,
    "deepseek_v2": deepseek_v2,
    "deepseek_v3": deepseek_v3,
    "gpt_oss": gpt_oss,
}
