"""Turn a Hugging Face ``config.json`` (as a dict) into a ``ModelSpec``.

Users already have a config.json for the model they train; asking them to restate its sizes is
where estimates go wrong. Families are recognised by their fields, not by ``model_type`` alone,
so a fine-tuned derivative with a new ``model_type`` still loads. Missing fields raise a
``ConfigError`` that names the field and says what to add.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.errors import ConfigError, UnknownPreset
from dssup.memory.presets import PRESETS
from dssup.memory.spec import MLASpec, ModelSpec, MoESpec

__all__ = ["model_from_hf_config", "preset", "preset_names"]


def preset_names() -> list[str]:
    """Names accepted by ``preset`` (and by ``--model``)."""
    return sorted(PRESETS)


def preset(name: str) -> ModelSpec:
    """The ``ModelSpec`` of a shipped preset, e.g. ``deepseek-v3``."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise UnknownPreset(
            "model",
            f"unknown preset {name!r}",
            f"use one of {', '.join(preset_names())} or a path to a config.json",
        )
    return model_from_hf_config(PRESETS[key], name=key)


def _req(cfg: Mapping[str, Any], key: str, *alts: str) -> int:
    for k in (key, *alts):
        value = cfg.get(k)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"config.json:{k}",
                    f"expected a non-negative integer, got {value!r}",
                    f"set {k} to a whole number",
                )
            return value
    raise ConfigError(f"config.json:{key}", "missing", f"add {key!r} to the config.json")


def _opt(cfg: Mapping[str, Any], key: str, default: int) -> int:
    return _req(cfg, key) if cfg.get(key) is not None else default


def _mla(cfg: Mapping[str, Any]) -> MLASpec | None:
    if cfg.get("kv_lora_rank") is None:
        return None
    return MLASpec(
        q_lora_rank=_opt(cfg, "q_lora_rank", 0),
        kv_lora_rank=_req(cfg, "kv_lora_rank"),
        qk_nope_head_dim=_req(cfg, "qk_nope_head_dim"),
        qk_rope_head_dim=_req(cfg, "qk_rope_head_dim"),
        v_head_dim=_req(cfg, "v_head_dim"),
    )


def _moe(cfg: Mapping[str, Any], ffn: int) -> MoESpec | None:
    n = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if not n:
        return None
    key = next(k for k in ("n_routed_experts", "num_local_experts", "num_experts") if cfg.get(k))
    n_routed = _req(cfg, key)
    expert_ffn = _opt(cfg, "moe_intermediate_size", ffn)
    shared_ffn_total = cfg.get("shared_expert_intermediate_size")
    if shared_ffn_total:  # Qwen2-MoE: one shared expert of its own size, behind a gate
        n_shared, shared_ffn, gate = 1, _req(cfg, "shared_expert_intermediate_size"), True
    else:
        n_shared, shared_ffn, gate = _opt(cfg, "n_shared_experts", 0), expert_ffn, False
    return MoESpec(
        n_routed=n_routed,
        n_shared=n_shared,
        top_k=_req(cfg, "num_experts_per_tok"),
        expert_ffn=expert_ffn,
        shared_ffn=shared_ffn,
        shared_gate=gate,
        router_bias=cfg.get("topk_method") == "noaux_tc" or cfg.get("scoring_func") == "sigmoid",
        first_dense=_opt(cfg, "first_k_dense_replace", 0),
        every=max(1, _opt(cfg, "decoder_sparse_step", 1))
        if "decoder_sparse_step" in cfg
        else max(1, _opt(cfg, "moe_layer_freq", 1)),
        dense_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()),
    )


def model_from_hf_config(cfg: Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """Build a ``ModelSpec`` from the fields of a Hugging Face ``config.json``."""
    if not isinstance(cfg, Mapping):
        raise ConfigError("config.json", "expected a JSON object", "pass the model's config.json")
    hidden = _req(cfg, "hidden_size", "n_embd", "d_model")
    heads = _req(cfg, "num_attention_heads", "n_head")
    ffn = _req(cfg, "intermediate_size", "ffn_dim")
    mla = _mla(cfg)
    kv_heads = heads if mla else _opt(cfg, "num_key_value_heads", heads)
    head_dim = _opt(cfg, "head_dim", hidden // heads if heads else 0)
    label = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "custom")
    return ModelSpec(
        name=label,
        hidden=hidden,
        ffn=ffn,
        layers=_req(cfg, "num_hidden_layers", "n_layer"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=_req(cfg, "vocab_size"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention="mla" if mla else "gqa",
        qkv_bias=cfg.get("model_type") in {"qwen2", "qwen2_moe"} or bool(cfg.get("attention_bias")),
        mla=mla,
        moe=_moe(cfg, ffn),
        mtp_depth=_opt(cfg, "num_nextn_predict_layers", 0),
    )
