"""Architectures read exactly from real config.json files, or refused by name.

The configs are the registry's real files (sources in dssup/modelzoo/catalog.json) and the bad
inputs in tests/fixtures/models (sources in its README). Parameter totals of these files equal
transformers' own count on the meta device (tests/integration/test_param_counts.py); here the
fields that decide them are checked one by one, without torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dssup import modelzoo
from dssup.errors import ConfigError, UnknownModelType
from dssup.memory import (
    Layout,
    Training,
    estimate,
    known_model_types,
    model_from_hf_config,
    preset,
)
from dssup.memory.activations import Ctx, layer_terms
from dssup.memory.params import model_total

FIXTURES = Path(__file__).parents[2] / "fixtures" / "models"


def cfg(hub_id: str) -> dict[str, Any]:
    entry = modelzoo.find(hub_id)
    assert entry is not None, hub_id
    return modelzoo.load_config(entry)


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def test_phi1_is_a_gelu_two_matrix_model_with_biases() -> None:
    m = model_from_hf_config(cfg("microsoft/phi-1"))
    assert (m.mlp_kind, m.norm_kind, m.norm_bias, m.layer_norms) == ("plain", "layer", True, 1)
    assert m.parallel_block and m.head_bias and m.qkv_bias and m.attn_out_bias and m.mlp_bias
    assert not m.tie_embeddings
    # transformers' PhiForCausalLM on the meta device: 1,414,562,935 (the issue saw 1.82 B)
    assert model_total(m, "megatron") == 1_414_562_935


def test_gemma2_ties_its_head_by_default_and_says_so() -> None:
    raw = cfg("google/gemma-2-9b-it")
    assert "tie_word_embeddings" not in raw
    m = model_from_hf_config(raw)
    assert m.tie_embeddings and m.layer_norms == 4 and m.mlp_kind == "gated"
    assert m.sliding_window == 4096 and m.sliding_layers == 21
    assert any("tie_word_embeddings absent: gemma2 ties" in n for n in m.notes)
    assert model_total(m, "megatron") == 9_241_705_984  # transformers' count
    two_b = model_from_hf_config(cfg("google/gemma-2-2b-it"))
    assert round(model_total(two_b, "megatron") / 1e9, 2) == 2.61  # the issue saw 3.20 B


def test_llama32_ties_by_its_field() -> None:
    m = model_from_hf_config(cfg("meta-llama/Llama-3.2-1B"))
    assert m.tie_embeddings and not m.notes
    assert model_total(m, "megatron") == 1_235_814_400


@pytest.mark.parametrize(
    ("hub_id", "fields"),
    [
        ("openai-community/gpt2", {"learned_positions": 1024, "tie_embeddings": True}),
        ("Qwen/Qwen3-0.6B", {"qk_norm": "head", "tie_embeddings": True}),
        ("google/gemma-3-1b-it", {"qk_norm": "head", "layer_norms": 4, "sliding_window": 512}),
        ("bigcode/starcoder2-7b", {"mlp_kind": "plain", "norm_kind": "layer", "mlp_bias": True}),
        ("openai/gpt-oss-20b", {"attn_sinks": True, "sliding_layers": 12, "qkv_bias": True}),
        ("mistralai/Mistral-7B-v0.1", {"sliding_window": 4096, "sliding_layers": 32}),
        ("microsoft/phi-4", {"mlp_kind": "gated", "norm_kind": "rms", "tie_embeddings": False}),
    ],
)
def test_family_fields(hub_id: str, fields: dict[str, Any]) -> None:
    m = model_from_hf_config(cfg(hub_id))
    for key, value in fields.items():
        assert getattr(m, key) == value, key


def test_gpt_oss_experts_and_router_carry_biases() -> None:
    m = model_from_hf_config(cfg("openai/gpt-oss-20b"))
    assert m.moe is not None and m.moe.expert_bias and m.moe.router_bias
    assert model_total(m, "megatron") == 20_914_757_184


def test_multimodal_reads_text_config_and_says_so() -> None:
    m = model_from_hf_config(cfg("Qwen/Qwen3-VL-30B-A3B-Instruct"))
    assert m.moe is not None and m.moe.n_routed == 128
    assert not m.tie_embeddings  # the wrapper's field wins over text_config's
    assert any("text model under text_config is counted" in n for n in m.notes)
    small = model_from_hf_config(cfg("Qwen/Qwen3-VL-2B-Instruct"))
    assert small.tie_embeddings
    assert model_total(small, "megatron") == 1_720_574_976


@pytest.mark.parametrize(
    ("name", "pointer"),
    [
        (
            "deepseek-inference-config_671B.json",
            "deepseek-ai/DeepSeek-V3 (or the preset deepseek-v3)",
        ),
        ("deepseek-inference-config_v3.1.json", "deepseek-ai/DeepSeek-V3"),
        (
            "deepseek-inference-config_236B.json",
            "deepseek-ai/DeepSeek-V2 (or the preset deepseek-v2)",
        ),
        ("deepseek-inference-config_16B.json", "deepseek-ai/DeepSeek-V2-Lite"),
    ],
)
def test_deepseek_inference_config_is_recognised(name: str, pointer: str) -> None:
    with pytest.raises(UnknownModelType) as err:
        model_from_hf_config(fixture(name))
    assert "DeepSeek's own inference config" in err.value.problem
    assert pointer in err.value.fix


def test_unknown_type_is_refused_with_the_list() -> None:
    with pytest.raises(UnknownModelType) as err:
        model_from_hf_config(fixture("moonshotai--Kimi-K2-Instruct.json"))
    assert "'kimi_k2' is not one dssup reads exactly" in err.value.problem
    assert ", ".join(known_model_types()) in err.value.fix
    assert "--approximate-as" in err.value.fix
    with pytest.raises(UnknownModelType, match="mixformer-sequential"):
        model_from_hf_config(fixture("microsoft--phi-2-mixformer.json"))


def test_named_approximation_is_stated() -> None:
    kimi = fixture("moonshotai--Kimi-K2-Instruct.json")
    m = model_from_hf_config(kimi, approximate_as="deepseek_v3")
    assert m.mla is not None and m.moe is not None and m.moe.n_routed == 384
    assert m.notes[0].startswith("APPROXIMATION: model_type 'kimi_k2' is not read exactly")
    e = estimate(m, Layout(), Training(seq_len=512))
    assert m.notes[0] in e.assumptions
    with pytest.raises(ConfigError, match="drop --approximate-as"):
        model_from_hf_config(cfg("meta-llama/Llama-3.2-1B"), approximate_as="llama")
    with pytest.raises(ConfigError, match="not a family dssup reads"):
        model_from_hf_config(kimi, approximate_as="kimi")


def test_missing_model_type_is_refused() -> None:
    with pytest.raises(UnknownModelType, match="model_type: missing"):
        model_from_hf_config({"hidden_size": 8, "num_attention_heads": 2})


def test_only_assumptions_that_apply() -> None:
    llama = estimate(preset("llama-3-8b"), Layout(tp=2), Training(seq_len=512))
    text = "\n".join(llama.assumptions)
    assert "W_QR" not in text and "MoE" not in text and "MLA" not in text
    assert "architecture: GQA 32 query / 8 KV heads of 128; gated silu MLP" in text
    v3 = estimate(preset("deepseek-v3"), Layout(tp=2, pp=16, ep=8, dp=32), Training())
    assert any("W_QR split by TP" in a for a in v3.assumptions)
    phi = estimate(model_from_hf_config(cfg("microsoft/phi-2")), Layout(), Training(seq_len=512))
    arch = next(a for a in phi.assumptions if a.startswith("architecture:"))
    assert "2-matrix gelu_new MLP" in arch and "LayerNorm with bias x1" in arch
    assert "parallel attention+MLP" in arch and "separate output head with bias" in arch


def _terms(m: Any) -> dict[str, int]:
    c = Ctx(m=m, conv="megatron", t=1, seq=1, s=1024, s_full=1024, flash=True, dropout=False,
            ep=1, etp=1, imbalance=1.0, vocab=m.vocab)  # fmt: skip
    return {t.name: t.bytes for t in layer_terms(c, False)}


def test_activation_terms_follow_the_block() -> None:
    llama = model_from_hf_config(cfg("meta-llama/Llama-3.2-1B"))
    plain = llama.model_copy(update={"mlp_kind": "plain"})
    t, p = _terms(llama), _terms(plain)
    # A gated MLP keeps its [s, 2f] gate/up output, a plain one its [s, f] fc1 output; both keep
    # one [s, f] activation output for the second matrix.
    assert p["mlp.fc1_out"] * 2 == t["mlp.fc1_out"] and p["mlp.act"] == t["mlp.act"]
    phi = _terms(model_from_hf_config(cfg("microsoft/phi-2")))
    assert "mlp.input" not in phi and "mlp.norm_out" not in phi  # one norm, shared input
    neox = _terms(llama.model_copy(update={"parallel_block": True}))
    assert "mlp.input" not in neox and "mlp.norm_out" in neox  # two norms of one input
    gemma = _terms(model_from_hf_config(cfg("google/gemma-2-9b-it")))
    assert {"attn.post_norm_input", "mlp.post_norm_input"} <= set(gemma)
    qwen3 = _terms(model_from_hf_config(cfg("Qwen/Qwen3-8B")))
    assert qwen3["attn.qk_norm_input"] == 2 * 1024 * (32 + 8) * 128


def test_presets_equal_the_real_configs() -> None:
    """The presets' sizes are the published configs' (one source checked against the other)."""
    pairs = {
        "deepseek-v3": "deepseek-ai/DeepSeek-V3",
        "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite",
        "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
        "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
        "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
        "llama-2-7b": "meta-llama/Llama-2-7b-hf",
        "qwen1.5-moe-a2.7b": "Qwen/Qwen1.5-MoE-A2.7B-Chat",
    }
    skip = {"name", "notes"}
    for name, hub_id in pairs.items():
        a = preset(name).model_dump(exclude=skip)
        b = model_from_hf_config(cfg(hub_id)).model_dump(exclude=skip)
        assert a == b, name


def test_deepseek_v2_preset_equals_deepseeks_own_236b_config() -> None:
    ds = fixture("deepseek-inference-config_236B.json")
    m = preset("deepseek-v2")
    assert m.moe is not None and m.mla is not None
    got = {
        "dim": m.hidden, "inter_dim": m.ffn, "moe_inter_dim": m.moe.expert_ffn,
        "n_layers": m.layers, "n_dense_layers": m.moe.first_dense, "n_heads": m.heads,
        "n_routed_experts": m.moe.n_routed, "n_shared_experts": m.moe.n_shared,
        "n_activated_experts": m.moe.top_k, "q_lora_rank": m.mla.q_lora_rank,
        "kv_lora_rank": m.mla.kv_lora_rank, "qk_nope_head_dim": m.mla.qk_nope_head_dim,
        "qk_rope_head_dim": m.mla.qk_rope_head_dim, "v_head_dim": m.mla.v_head_dim,
        "vocab_size": m.vocab,
    }  # fmt: skip
    assert got == {k: ds[k] for k in got}
