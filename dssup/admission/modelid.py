"""Which model a job trains, as real jobs state it.

Jobs name their model by a Hugging Face Hub id or a path, not by dssup's annotation:
``--model_name_or_path meta-llama/Meta-Llama-3-70B``, ``--model Qwen/Qwen2-7B``, a Kubeflow
Trainer model initializer (``storageUri: hf://...``, or ``STORAGE_URI`` on the runtime's
``model-initializer``), a torchtune recipe config (``--config llama3_2/1B_full``), or env vars
such as ``MODEL_ID``. ``find_reference`` returns the first such statement and where it was;
``known_model`` maps a Hub id to the model whose ``config.json`` the model registry ships
(``dssup.modelzoo``, the same registry ``dssup estimate --model`` reads), or None. A reference that is a local path or an
unknown id is reported by name (the policy allows the job with a warning saying what to add).

Megatron jobs name a tokenizer instead of ``--vocab-size``; ``tokenizer_vocab`` infers the
vocabulary of the common tokenizer types, and the caller prints what was inferred.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

from dssup import modelzoo
from dssup.admission.flags import MODEL_FLAGS, TORCHTUNE_CONFIG
from dssup.admission.source import Incomplete
from dssup.errors import UnknownModelType
from dssup.memory import ModelSpec
from dssup.modelio import registered_model

__all__ = [
    "MODEL_ENV",
    "MODEL_FLAGS",
    "Reference",
    "describe",
    "find_reference",
    "hub_id",
    "known_model",
    "tokenizer_vocab",
]

MODEL_ENV = ("MODEL_NAME_OR_PATH", "MODEL_ID", "MODEL_NAME", "HF_MODEL_ID", "BASE_MODEL", "MODEL")

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


@lru_cache(maxsize=256)
def _registered(hub: str) -> tuple[ModelSpec, str] | None:
    entry = modelzoo.find(hub)
    if entry is None:
        return None
    try:
        return registered_model(entry), entry.id
    except UnknownModelType as exc:  # shipped, but not an architecture dssup reads exactly
        raise Incomplete([f"a model dssup reads exactly: {entry.id}: {exc}"]) from None


def known_model(ref: str) -> tuple[ModelSpec, str] | None:
    """(model, its registry id) for a Hub reference whose config.json dssup ships (the model
    registry, ``dssup.modelzoo``), else None."""
    hub = hub_id(ref)
    return _registered(hub) if hub else None


def tokenizer_vocab(tokenizer_type: str | None) -> int | None:
    """Vocabulary of a Megatron ``--tokenizer-type`` with a fixed vocabulary, else None."""
    return TOKENIZERS.get(tokenizer_type or "")
