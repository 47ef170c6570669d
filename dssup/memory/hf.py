"""Turn a Hugging Face ``config.json`` (as a dict) into a ``ModelSpec``: exactly, or refused by name.

Users already have a config.json for the model they train; asking them to restate its sizes is
where estimates go wrong, and so is guessing: a GELU 2-matrix MLP read as SwiGLU, or an untied
head for Gemma, miscounts by a quarter. So the ``model_type`` picks the family reader that
mirrors transformers' modeling code (``families.py``, ``families_moe.py``); a type dssup does not
know is refused with the list of known ones, unless the caller names an approximation
(``approximate_as``), which is then stated among the assumptions. Multimodal configs are read
through their ``text_config``; DeepSeek's own inference configs are recognised and refused with a
pointer to the Hugging Face config or the preset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.errors import ConfigError, UnknownModelType, UnknownPreset
from dssup.memory.families_moe import FAMILIES, GENERIC
from dssup.memory.hfdefaults import TEXT_TYPES
from dssup.memory.hfread import Reader
from dssup.memory.presets import PRESETS
from dssup.memory.spec import ModelSpec

__all__ = [
    "known_model_types",
    "model_from_hf_config",
    "preset",
    "preset_names",
]

# Multimodal wrappers: the text model sits under ``text_config``; the head's tying is the
# wrapper's top-level field. Value: the family that reads the text model.
WRAPPERS = {
    "qwen3_vl": "qwen3",
    "qwen3_vl_moe": "qwen3_moe",
    "gemma3": "gemma3_text",
    "qwen2_vl": "qwen2",
    "qwen2_5_vl": "qwen2",
}
# Wrappers whose published files (written before transformers nested them) keep the text
# model's fields at the top level: read there when the file has no ``text_config``.
FLAT_TEXT = frozenset({"qwen2_vl", "qwen2_5_vl"})
# DeepSeek's inference/configs/config_*.json (model.py ModelArgs) by hidden size.
_DS_INFERENCE = {"dim", "inter_dim", "n_layers", "n_heads"}
_DS_POINTER = {
    7168: "deepseek-ai/DeepSeek-V3 (or the preset deepseek-v3)",
    5120: "deepseek-ai/DeepSeek-V2 (or the preset deepseek-v2)",
    2048: "deepseek-ai/DeepSeek-V2-Lite (or the preset deepseek-v2-lite)",
}


def preset_names() -> list[str]:
    """Names accepted by ``preset`` (and by ``--model``)."""
    return sorted(PRESETS)


def known_model_types() -> list[str]:
    """``model_type`` values read exactly (multimodal wrappers included)."""
    return sorted([*FAMILIES, *WRAPPERS], key=str.lower)


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


def _unknown(what: object) -> UnknownModelType:
    problem = (
        f"model_type {what!r} is not one dssup reads exactly"
        if what
        else "missing (every Hugging Face config.json names its model_type)"
    )
    return UnknownModelType(
        "config.json:model_type",
        problem,
        f"known: {', '.join(known_model_types())}; to read it as one of them anyway, add "
        "--approximate-as <type> (the approximation is printed with the estimate)",
    )


def _check_shape(cfg: Mapping[str, Any]) -> None:
    if not cfg.get("model_type") and set(cfg) >= _DS_INFERENCE:
        dim = cfg.get("dim")
        raise UnknownModelType(
            "config.json",
            "this is DeepSeek's own inference config (inference/configs/config_*.json: dim, "
            "n_layers, ...), not a Hugging Face config.json",
            f"pass the Hugging Face config.json of {_DS_POINTER.get(dim, 'the model')}"
            if isinstance(dim, int)
            else "pass the model's Hugging Face config.json",
        )


def _approximation(approximate_as: str, mtype: object, text: bool) -> tuple[str, list[str]]:
    if approximate_as != "generic" and approximate_as not in FAMILIES:
        raise ConfigError(
            "approximate_as",
            f"{approximate_as!r} is not a family dssup reads",
            f"use one of {', '.join(sorted(FAMILIES))} or generic",
        )
    part = "its text_config" if text else "it"
    what = f"model_type {mtype!r}" if mtype else "a config without model_type"
    return approximate_as, [
        f"APPROXIMATION: {what} is not read exactly; {part} was read as {approximate_as} on "
        "request (--approximate-as): check the architecture line"
    ]


def _family(cfg: Mapping[str, Any], approximate_as: str | None) -> tuple[str, bool, list[str]]:
    """(family, read text_config, notes) for a config."""
    mtype = cfg.get("model_type")
    text = isinstance(cfg.get("text_config"), Mapping)
    if isinstance(mtype, str) and (mtype in FAMILIES or mtype in WRAPPERS):
        if approximate_as is not None:
            raise ConfigError(
                "approximate_as",
                f"model_type {mtype!r} is read exactly",
                "drop --approximate-as",
            )
        if mtype in WRAPPERS:
            if not text and mtype not in FLAT_TEXT:
                raise ConfigError("config.json:text_config", "missing", "pass the full config")
            where = "under text_config" if text else "(its fields at the top level)"
            return (
                WRAPPERS[mtype],
                text,
                [
                    f"multimodal {mtype}: the text model {where} is counted; the vision tower "
                    "and projector are not (their memory is not estimated)"
                ],
            )
        return mtype, False, []
    if approximate_as is None:
        raise _unknown(mtype)
    family, notes = _approximation(approximate_as, mtype, text)
    return family, text, notes


def model_from_hf_config(
    cfg: Mapping[str, Any], name: str | None = None, approximate_as: str | None = None
) -> ModelSpec:
    """Build a ``ModelSpec`` from a Hugging Face ``config.json`` (a dict): read exactly by its
    ``model_type``, refused when the type is unknown unless ``approximate_as`` names a family
    (or ``generic``) to read it as."""
    if not isinstance(cfg, Mapping):
        raise ConfigError("config.json", "expected a JSON object", "pass the model's config.json")
    _check_shape(cfg)
    family, text, notes = _family(cfg, approximate_as)
    mtype = str(cfg.get("model_type") or "")
    inner = TEXT_TYPES.get(mtype, family)
    if text:
        inner = str(cfg["text_config"].get("model_type") or inner)
    top = Reader(cfg, kind=inner if mtype in FLAT_TEXT else mtype)
    reader = Reader(cfg["text_config"], "config.json:text_config", inner) if text else top
    read = GENERIC if family == "generic" else FAMILIES[family]
    fields = read(reader, top if text else None)
    label = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "custom")
    notes += top.notes + (reader.notes if text else [])
    return ModelSpec(name=label, notes=tuple(notes), **fields)
