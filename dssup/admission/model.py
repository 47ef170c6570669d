"""The model a job trains: its annotation, its Megatron model flags, or a reference it names.

In that order. ``dssup.io/model`` is a preset or ``configmap:<name>/<key>`` (a Hugging Face
config.json in the job's namespace, from the watch cache; not cached: ``cache-miss``). Megatron
jobs describe the model with flags (``--num-layers`` ...), the vocabulary with ``--vocab-size``
or a tokenizer (inferred, with a warning). Otherwise ``modelid`` finds the reference the job
states (Hub id, initializer, torchtune config, env) and the model it names, if dssup knows it;
the key returned identifies the model for the estimate caches.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from dssup.admission import annotations as ann
from dssup.admission import modelid
from dssup.admission.cache import ClusterCache
from dssup.admission.flags import MEGATRON_MODEL, MEGATRON_TOKENIZER
from dssup.admission.source import Incomplete, Sources, switch
from dssup.errors import ConfigError, UnknownModelType
from dssup.memory import ModelSpec, model_from_hf_config, preset

__all__ = ["job_model"]


@lru_cache(maxsize=64)
def _preset(name: str) -> ModelSpec:
    return preset(name)


@lru_cache(maxsize=256)
def _hf_model(text: str, label: str) -> ModelSpec:
    try:
        cfg = json.loads(text)
    except ValueError:
        raise ConfigError(
            ann.MODEL, f"{label} is not JSON", "store the model's config.json"
        ) from None
    try:
        return model_from_hf_config(cfg, name=label)
    except UnknownModelType as exc:  # not a wrong value: dssup cannot judge this model
        raise Incomplete([f"a model dssup reads exactly: {label}: {exc}"]) from None


def _model_from_annotation(src: Sources, cache: ClusterCache, value: str) -> tuple[ModelSpec, str]:
    if not value.startswith("configmap:"):
        registered = modelid.known_model(value) if "/" in value else None
        if registered is not None:  # a Hub id of the model registry
            return registered[0], f"hub:{registered[1]}"
        return _preset(value), f"preset:{value.strip().lower()}"
    name, _, key = value[len("configmap:") :].partition("/")
    if not name or not key:
        raise ConfigError(
            ann.MODEL, f"{value!r} is not configmap:<name>/<key>", "name the ConfigMap and key"
        )
    data = cache.config_map(src.view.namespace, name)
    if data is None:
        raise Incomplete([f"cache miss: ConfigMap {name} (model config) not in the cache"])
    if key not in data:
        raise ConfigError(ann.MODEL, f"ConfigMap {name} has no key {key!r}", "use an existing key")
    return _hf_model(
        data[key], f"{name}/{key}"
    ), f"cm:{src.view.namespace}/{name}/{key}:{hash(data[key])}"


_FREQ = re.compile(r"^\(?\[0\]\*(\d+)\s*\+\s*\[1\]\*(\d+)\)?$")


def _vocab(src: Sources) -> tuple[int, str] | None:
    """The vocabulary a Megatron tokenizer implies, and a warning saying it was inferred."""
    kind = src.value(MEGATRON_TOKENIZER["type"])
    n = modelid.tokenizer_vocab(kind)
    if n is not None:
        return n, f"vocabulary {n} inferred from --tokenizer-type {kind}"
    ref = src.value(MEGATRON_TOKENIZER["model"])
    known = modelid.known_model(ref) if ref else None
    if known is not None:
        return known[0].vocab, f"vocabulary {known[0].vocab} inferred from --tokenizer-model {ref}"
    return None


def _megatron_model(src: Sources) -> tuple[ModelSpec, str] | None:
    raw: dict[str, Any] = {}
    for key, names in MEGATRON_MODEL.items():
        hit = src.flag(names)
        if hit is not None and hit.value is not None:
            raw[key] = hit.value
    if "num_hidden_layers" not in raw or "hidden_size" not in raw:
        return None
    cfg: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "moe_layer_freq":
            m = _FREQ.match(value.replace(" ", ""))
            if m:
                cfg["first_k_dense_replace"] = int(m.group(1))
            continue
        if not (value.isascii() and value.isdigit()):
            raise ConfigError(f"--{key}", f"{value!r} is not an integer", "use a whole number")
        cfg[key] = int(value)
    cfg.setdefault("intermediate_size", 4 * cfg["hidden_size"])
    if "vocab_size" not in cfg:
        inferred = _vocab(src)
        if inferred is None:
            raise Incomplete(
                [
                    "the vocabulary size: add --vocab-size (or a known --tokenizer-type) or "
                    "annotation dssup.io/model"
                ]
            )
        cfg["vocab_size"] = inferred[0]
        src.warnings.append(inferred[1])
    if not switch(src, "gqa"):
        cfg.pop("num_key_value_heads", None)
    if not switch(src, "mla"):
        for key in (
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        ):
            cfg.pop(key, None)
    shared = cfg.pop("shared_size", 0)
    expert = cfg.get("moe_intermediate_size", cfg["intermediate_size"])
    if shared and expert and shared % expert == 0:
        cfg["n_shared_experts"] = shared // expert
    elif shared:
        cfg["shared_expert_intermediate_size"] = shared
    cfg["tie_word_embeddings"] = not switch(src, "untie")
    key = "megatron:" + ",".join(f"{k}={v}" for k, v in sorted(cfg.items()))
    return model_from_hf_config(cfg, name="megatron-args", approximate_as="generic"), key


def job_model(src: Sources, cache: ClusterCache) -> tuple[ModelSpec, str]:
    """(model, cache key) of the job; ``Incomplete`` naming what to add, or ``ConfigError``."""
    value = src.view.annotations.get(ann.MODEL)
    if value:
        return _model_from_annotation(src, cache, value.strip())
    found = _megatron_model(src)
    if found is not None:
        return found

    def flag(names: frozenset[str]) -> tuple[str, str] | None:
        hit = src.flag(names)
        return (hit.flag, hit.value) if hit is not None and hit.value else None

    ref = modelid.find_reference(flag, src.literal_env, src.view.model_refs)
    if ref is None:
        raise Incomplete(
            ["the model: add annotation dssup.io/model (a preset or configmap:<name>/<key>)"]
        )
    known = modelid.known_model(ref.value)
    if known is None:
        what = modelid.describe(ref.value)
        raise Incomplete(
            [
                f"the model: {ref.where} names {ref.value[:80]!r}, {what}; add annotation "
                "dssup.io/model (a preset or configmap:<name>/<key>)"
            ]
        )
    spec, name = known
    src.warnings.append(f"model {name} inferred from {ref.where} {ref.value[:80]}")
    return spec, f"hub:{name}"
