"""Falcon's two config formats are read exactly: transformers' ``falcon`` and tiiuae's earlier
``RefinedWebModel`` (Falcon-7B) / ``RefinedWeb`` (Falcon-40B) of the remote code modelling_RW.py.

The legacy files are the real ones the registry ships (tt-buda's and a Hub mirror's copies); the
transformers-format readings beside them are Tenstorrent's transcriptions of the instruct
releases. Parameter totals against transformers and the published checkpoints are in
tests/integration/memory/test_param_counts.py.
"""

from __future__ import annotations

import pytest

from dssup import modelzoo
from dssup.errors import ConfigError
from dssup.memory import known_model_types, model_from_hf_config
from dssup.memory.spec import ModelSpec


def _read(hub: str) -> tuple[dict[str, object], ModelSpec]:
    entry = modelzoo.find(hub)
    assert entry is not None
    cfg = modelzoo.load_config(entry)
    return cfg, model_from_hf_config(cfg)


def test_falcon_7b_legacy_file_reads_as_modelling_rw_builds_it() -> None:
    cfg, spec = _read("tiiuae/falcon-7b")
    assert cfg["model_type"] == "RefinedWebModel"
    # 32 layers of 4544 with 71 heads of 64; multi_query: one K/V head; one LayerNorm feeding
    # the parallel attention and MLP; exact-GELU MLP of 4 x hidden; no biases; tied head
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim) == (
        32, 4544, 71, 1, 64,
    )  # fmt: skip
    assert (spec.ffn, spec.parallel_block, spec.layer_norms) == (4 * 4544, True, 1)
    assert (spec.mlp_kind, spec.qkv_bias, spec.mlp_bias, spec.tie_embeddings) == (
        "plain", False, False, True,
    )  # fmt: skip
    assert any("pre-transformers Falcon format" in n for n in spec.notes)


def test_falcon_40b_legacy_file_reads_as_modelling_rw_builds_it() -> None:
    cfg, spec = _read("tiiuae/falcon-40b")
    assert cfg["model_type"] == "RefinedWeb"
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads) == (60, 8192, 128, 8)
    assert (spec.parallel_block, spec.layer_norms, spec.ffn) == (True, 2, 4 * 8192)


def test_legacy_defaults_are_rwconfigs_and_said() -> None:
    _, spec = _read("tiiuae/falcon-7b")
    cfg = {k: v for k, v in modelzoo.load_config(modelzoo.find("tiiuae/falcon-7b")).items()  # type: ignore[arg-type]
           if k not in ("multi_query", "parallel_attn")}  # fmt: skip
    bare = model_from_hf_config(cfg)
    # RWConfig's defaults: full multi-head K/V, sequential block with two LayerNorms
    assert (bare.kv_heads, bare.parallel_block, bare.layer_norms) == (71, False, 2)
    assert {"multi_query absent: RWConfig's default is false",
            "parallel_attn absent: RWConfig's default is false"} <= set(bare.notes)  # fmt: skip
    assert not any("absent: RWConfig" in n for n in spec.notes)


def test_what_the_legacy_format_cannot_say_is_refused_by_name() -> None:
    cfg = dict(modelzoo.load_config(modelzoo.find("tiiuae/falcon-40b")))  # type: ignore[arg-type]
    del cfg["n_head_kv"]
    with pytest.raises(ConfigError) as err:
        model_from_hf_config(cfg)
    assert err.value.field == "config.json:n_head_kv" and err.value.problem == "missing"
    rw_1b = {"model_type": "RefinedWebModel", "alibi": True, "hidden_size": 2048, "n_head": 32,
             "n_layer": 24, "vocab_size": 50304}  # fmt: skip
    with pytest.raises(ConfigError, match="ALiBi"):
        model_from_hf_config(rw_1b)


def test_model_types_are_listed_case_insensitively() -> None:
    types = known_model_types()
    assert {"falcon", "RefinedWeb", "RefinedWebModel"} <= set(types)
    assert types == sorted(types, key=str.lower) and types[0] == "deepseek_v2"
