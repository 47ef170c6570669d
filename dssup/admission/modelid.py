"""Which model a job trains, as real jobs state it.

Jobs name their model by a Hugging Face Hub id or a path, not by dssup's annotation:
``--model_name_or_path meta-llama/Meta-Llama-3-70B``, ``--model Qwen/Qwen2-7B``, a Kubeflow
Trainer model initializer (``storageUri: hf://...``, or ``STORAGE_URI`` on the runtime's
``model-initializer``), a torchtune recipe config (``--config llama3_2/1B_full``), or env vars
such as ``MODEL_ID``. ``find_reference`` returns the first such statement and where it was;
``known_model`` maps a Hub id to a model dssup has the ``config.json`` of (the presets shipped
with ``dssup.memory``, by their Hub ids), or None. A reference that is a local path or an
unknown id is reported by name (the policy allows the job with a warning saying what to add).

Megatron jobs name a tokenizer instead of ``--vocab-size``; ``tokenizer_vocab`` infers the
vocabulary of the common tokenizer types, and the caller prints what was inferred.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from dssup.memory import ModelSpec, preset

__all__ = [
    "HUB_IDS",
    "MODEL_ENV",
    "MODEL_FLAGS",
    "Reference",
    "describe",
    "find_reference",
    "hub_id",
    "known_model",
    "tokenizer_vocab",
]

MODEL_FLAGS = frozenset(
    {
        "--model_name_or_path",
        "--model-name-or-path",
        "--pretrained_model_name_or_path",
        "--model",
        "--model_id",
        "--model-id",
        "--model_name",
        "--model-name",
        "--base_model",
        "--hf_model",
    }
)
TORCHTUNE_CONFIG = frozenset({"--config"})
MODEL_ENV = ("MODEL_NAME_OR_PATH", "MODEL_ID", "MODEL_NAME", "HF_MODEL_ID", "BASE_MODEL", "MODEL")

# Hub ids (lower case) of the models whose config.json ships with dssup (dssup.memory presets).
HUB_IDS: dict[str, str] = {
    "deepseek-ai/deepseek-v2-lite": "deepseek-v2-lite",
    "deepseek-ai/deepseek-v2-lite-chat": "deepseek-v2-lite",
    "deepseek-ai/deepseek-v2": "deepseek-v2",
    "deepseek-ai/deepseek-v2-chat": "deepseek-v2",
    "deepseek-ai/deepseek-v3": "deepseek-v3",
    "deepseek-ai/deepseek-v3-base": "deepseek-v3",
    "deepseek-ai/deepseek-v3-0324": "deepseek-v3",
    "deepseek-ai/deepseek-r1": "deepseek-v3",
    "meta-llama/llama-2-7b-hf": "llama-2-7b",
    "meta-llama/llama-2-7b-chat-hf": "llama-2-7b",
    "meta-llama/llama-2-7b": "llama-2-7b",
    "meta-llama/meta-llama-3-8b": "llama-3-8b",
    "meta-llama/meta-llama-3-8b-instruct": "llama-3-8b",
    "meta-llama/meta-llama-3-70b": "llama-3-70b",
    "meta-llama/meta-llama-3-70b-instruct": "llama-3-70b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mistralai/mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "qwen/qwen1.5-moe-a2.7b": "qwen1.5-moe-a2.7b",
    "qwen/qwen1.5-moe-a2.7b-chat": "qwen1.5-moe-a2.7b",
    "qwen/qwen2-7b": "qwen2-7b",
    "qwen/qwen2-7b-instruct": "qwen2-7b",
}
# torchtune recipe configs (``tune run ... --config llama3_2/1B_full``): the model they load.
TORCHTUNE: dict[str, str] = {
    "llama2/7b": "meta-llama/Llama-2-7b-hf",
    "llama3/8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama3/70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "llama3_1/8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama3_1/70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama3_2/1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama3_2/3b": "meta-llama/Llama-3.2-3B-Instruct",
    "qwen2/7b": "Qwen/Qwen2-7B-Instruct",
    "qwen2_5/1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
}
# Megatron --tokenizer-type values with a fixed vocabulary (before Megatron's padding).
TOKENIZERS: dict[str, int] = {
    "GPT2BPETokenizer": 50257,
    "Llama2Tokenizer": 32000,
}


class Reference(NamedTuple):
    """A model reference and where the job states it."""

    value: str
    where: str


def hub_id(ref: str) -> str | None:
    """``org/name`` of a Hub reference (``hf://org/name``, ``org/name``), None for a path."""
    text = ref.strip()
    if text.startswith("hf://"):
        text = text[len("hf://") :]
    text = text.strip("/")
    if not text or text.startswith((".", "~", "$")) or "://" in text or ref.strip().startswith("/"):
        return None
    parts = text.split("/")
    return text if len(parts) == 2 and all(parts) else None


def _torchtune(value: str) -> str | None:
    key = value.strip().lower()
    for prefix, hub in TORCHTUNE.items():
        if key.startswith(prefix + "_") or key == prefix:
            return hub
    return None


def find_reference(
    flag: Callable[[frozenset[str]], tuple[str, str] | None],
    env: Callable[[str], str | None],
    kind_refs: tuple[tuple[str, str], ...],
) -> Reference | None:
    """The job's first model statement: flags, then torchtune configs, then what the kind
    states (a TrainJob's initializer), then env vars. ``flag(names)`` gives (flag, value) of
    the last occurrence of any of ``names`` (last wins, as argparse), ``env(name)`` a literal."""
    found = flag(MODEL_FLAGS)
    if found:
        return Reference(found[1], found[0])
    found = flag(TORCHTUNE_CONFIG)
    if found and (hub := _torchtune(found[1])):
        return Reference(hub, f"torchtune config {found[1]}")
    if kind_refs:
        where, value = kind_refs[0]
        return Reference(value, where)
    for name in MODEL_ENV:
        text = env(name)
        if text:
            return Reference(text, f"env {name}")
    return None


def describe(ref: str) -> str:
    """Why a reference names no model dssup knows, in a few words."""
    text = ref.strip()
    if "$" in text or "{{" in text:
        return "an unrendered template variable"
    if text.startswith(("/", ".", "~")) or "://" in text.replace("hf://", ""):
        return "a path dssup cannot read"
    if hub_id(text) is None:
        return "not a Hugging Face Hub id"
    return "a model whose config.json dssup does not ship"


def known_model(ref: str) -> tuple[ModelSpec, str] | None:
    """(model, its preset name) for a reference whose config.json dssup ships, else None."""
    hub = hub_id(ref)
    name = HUB_IDS.get(hub.lower()) if hub else None
    if name is None:
        return None
    return preset(name), name


def tokenizer_vocab(tokenizer_type: str | None) -> int | None:
    """Vocabulary of a Megatron ``--tokenizer-type`` with a fixed vocabulary, else None."""
    return TOKENIZERS.get(tokenizer_type or "")
