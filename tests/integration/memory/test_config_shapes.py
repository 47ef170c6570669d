"""Configs read as transformers reads them, in every shape they come in (issue 36).

1. The shapes ``save_pretrained`` writes: every config of the registry is loaded by the pinned
   transformers (``AutoConfig.for_model``), saved back (which spells every field and writes new
   attribute names such as Qwen3-MoE's ``num_local_experts``) and read by dssup again: the model
   dssup reads must not change.
2. The shapes publishers wrote (``tests/fixtures/models/published``: Gemma-3's multimodal file
   with a ``text_config`` that leaves vocab size and heads to the defaults; Qwen2.5-VL with its
   text model at the top level): dssup's parameter count equals that of the model transformers
   builds from the same file on the meta device.
3. The defaults and aliases dssup ships (``dssup/memory/hfdefaults.py``) are those of the
   installed transformers' config classes.
"""

from __future__ import annotations

import inspect
import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from dssup import modelzoo
from dssup.memory import model_from_hf_config
from dssup.memory.hfdefaults import ALIASES, DEFAULTS, TEXT_TYPES, TRANSFORMERS
from dssup.memory.params import model_total
from dssup.modelio import load_model

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.hfmeta import meta_count  # noqa: E402

PUBLISHED = Path(__file__).parents[2] / "fixtures" / "models" / "published"
FAMILY_SOURCES = Path(__file__).parents[3] / "dssup" / "memory"
LEGACY_FALCON = {"RefinedWebModel", "RefinedWeb"}  # remote code: transformers cannot load them
ENTRIES = [
    e
    for e in modelzoo.entries()
    if e.file is not None and modelzoo.load_config(e).get("model_type") not in LEGACY_FALCON
]


def _shape(cfg: dict[str, Any]) -> dict[str, Any]:
    """What an estimate depends on: every field of the spec but its name and notes."""
    return model_from_hf_config(cfg).model_dump(exclude={"name", "notes"})


def _resaved(cfg: dict[str, Any], folder: Path) -> dict[str, Any]:
    from transformers import AutoConfig

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoConfig.for_model(**cfg).save_pretrained(folder)
    doc: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return doc


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.id)
def test_a_save_pretrained_copy_reads_as_the_original(entry: Any, tmp_path: Path) -> None:
    cfg = modelzoo.load_config(entry)
    again = _resaved(cfg, tmp_path)
    assert _shape(again) == _shape(cfg)


def test_qwen3_moe_as_save_pretrained_writes_it(tmp_path: Path) -> None:
    """The issue's case: transformers 5.x writes ``num_local_experts``, not ``num_experts``."""
    entry = modelzoo.find("Qwen/Qwen3-30B-A3B")
    assert entry is not None
    again = _resaved(modelzoo.load_config(entry), tmp_path)
    assert "num_local_experts" in again and "num_experts" not in again
    spec = load_model(tmp_path)
    assert spec.moe is not None and spec.moe.n_routed == 128


@pytest.mark.parametrize("name", sorted(p.name for p in PUBLISHED.glob("*.json")))
def test_published_shapes_count_what_transformers_builds(name: str) -> None:
    cfg = json.loads((PUBLISHED / name).read_text())
    ours = model_total(load_model(PUBLISHED / name), "megatron")
    assert ours == meta_count(cfg)


def test_gemma3_text_defaults_are_stated() -> None:
    spec = load_model(PUBLISHED / "google--gemma-3-4b-it.json")
    assert spec.vocab == 262208 and spec.heads == 8 and spec.kv_heads == 4
    said = " ".join(spec.notes)
    assert "text_config:vocab_size absent: 262208, the default of transformers" in said


def test_qwen25_vl_text_model_is_the_registry_qwen25_7b() -> None:
    vl = load_model(PUBLISHED / "Qwen--Qwen2.5-VL-7B-Instruct.json")
    base = load_model("Qwen/Qwen2.5-7B")
    keep = {"hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "vocab", "qkv_bias"}
    assert vl.model_dump(include=keep) == base.model_dump(include=keep)


def _read_keys() -> set[str]:
    src = "".join(p.read_text() for p in FAMILY_SOURCES.glob("families*.py"))
    keys = set(re.findall(r'(?:num|flag|text|get|int_list)\("([a-z_]+)"', src))
    return keys | {"vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers"}


def test_shipped_defaults_and_aliases_are_the_installed_transformers() -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    assert transformers.__version__ == TRANSFORMERS
    keys = _read_keys()
    types = set(DEFAULTS) | set(TEXT_TYPES.values())
    for kind in sorted(types):
        cls = CONFIG_MAPPING[kind]
        sig = inspect.signature(cls.__init__).parameters
        found = {
            k: p.default
            for k, p in sig.items()
            if k in keys
            and p.default is not inspect.Parameter.empty
            and isinstance(p.default, (int, str, bool))
        }
        assert DEFAULTS.get(kind, {}) == found, kind
        amap = {a: c for a, c in (cls.attribute_map or {}).items() if a in keys or c in keys}
        assert ALIASES.get(kind, {}) == amap, kind
