"""The worked examples of the spec (shared/spec/memory-model.md), reproduced to the byte."""

from __future__ import annotations

import pytest

from dssup.memory import Layout, Training, estimate, preset
from dssup.memory.activations import layer_terms
from dssup.memory.config import Overheads
from dssup.memory.core import make_ctx
from dssup.memory.defaults import resolve
from dssup.memory.params import attention_params, model_total, moe_params, norm_params

V3_STAGE = Layout(tp=2, pp=16, ep=8, etp=1, dp=32)


@pytest.fixture(scope="module")
def v3():
    return preset("deepseek-v3")


def test_v3_rmsnorm_stage_params_and_bytes(v3) -> None:
    assert norm_params(v3) == 16_384
    assert 4 * norm_params(v3) == 65_536
    assert 4 * norm_params(v3) * 2 == 131_072


def test_v3_mla_stage_params_and_bytes(v3) -> None:
    assert attention_params(v3, 1, "paper") == 187_105_280
    stage = 4 * attention_params(v3, 2, "paper")
    assert stage == 429_654_016
    assert stage * 2 == 859_308_032


def test_v3_moe_stage_params(v3) -> None:
    assert moe_params(v3, Layout(), "paper").total == 11_320_164_352
    assert 4 * moe_params(v3, V3_STAGE, "paper").total == 5_820_645_376
    one_expert = 3 * v3.hidden * v3.moe.expert_ffn
    assert one_expert == 44_040_192
    assert 4 * ((32 + 1) * one_expert + 256 * v3.hidden) == 5_820_645_376


def test_v3_stage1_estimate_matches_module_counts(v3) -> None:
    est = estimate(v3, V3_STAGE, Training(seq_len=4096, grad_accum=16), convention="paper")
    st = est.stages[1]
    assert st.layers == [4, 5, 6, 7]
    assert st.params.moe == 5_820_645_376
    assert st.params.non_moe == 429_654_016 + 65_536
    # 14 B/param without ZeRO: BF16 weights, FP32 grads, FP32 master + BF16 m and v
    assert st.bytes.weights == 2 * st.params.total
    assert st.bytes.gradients == 4 * st.params.total
    assert st.bytes.optimizer == 8 * st.params.total


def test_paper_partition_of_v3(v3) -> None:
    est = estimate(v3, V3_STAGE, Training(seq_len=4096), convention="paper")
    counts = [len(s.layers) for s in est.stages]
    assert counts == [4] * 15 + [1]
    assert est.stages[0].layers == [0, 1, 2, 3]
    assert est.stages[15].layers == [60]


def test_four_layer_mla_activation_formula(v3) -> None:
    training = Training(micro_batch=1, seq_len=4096)
    r = resolve("paper", training, Overheads())
    c = make_ctx(v3, V3_STAGE, training, "paper", r)
    mla = [t for t in layer_terms(c, moe_layer=True) if t.name.startswith("attn.")]
    four = 4 * sum(t.bytes for t in mla)
    b, s, h, a = 1, 4096, v3.hidden, v3.mla
    nh, dh, dhr = v3.heads, a.qk_nope_head_dim, a.qk_rope_head_dim
    formula = (
        10 * b * s * h
        + 8 * b * s * (a.q_lora_rank + a.kv_lora_rank)
        + 16 * b * s * dh * nh
        + 8 * b * s * dhr * nh
        + 10 * b * nh * s * s
    )
    assert four == formula
    assert round(four / 2**30, 3) == 21.586
    scores = 4 * sum(t.bytes for t in mla if t.group == "core_attn")
    assert scores == 20 * 2**30


def test_four_layer_mla_full_recompute_is_layer_input(v3) -> None:
    training = Training(micro_batch=2, seq_len=4096, recompute="full")
    est = estimate(v3, V3_STAGE, training, convention="paper")
    per_mb = est.stages[1].bytes.activations_per_micro_batch
    b, s, h, nr = 2, 4096, v3.hidden, v3.moe.top_k
    assert per_mb == 4 * (2 * b * s * h // 2) + 4 * (2 * b * s * h // 2 + 2 * b * s * nr)


@pytest.mark.parametrize(
    ("name", "total"),
    [
        ("deepseek-v3", 671_026_397_184),
        ("deepseek-v2", 235_741_429_760),
        ("deepseek-v2-lite", 15_706_482_176),
    ],
)
def test_deepseek_model_totals(name: str, total: int) -> None:
    assert model_total(preset(name), "paper") == total


def test_rounded_totals_as_published() -> None:
    assert round(model_total(preset("deepseek-v3")) / 1e9, 2) == 671.03
    assert round(model_total(preset("deepseek-v2")) / 1e9, 2) == 235.74
    assert round(model_total(preset("deepseek-v2-lite")) / 1e9, 2) == 15.71


@pytest.mark.parametrize(
    ("name", "total"),
    [
        ("llama-2-7b", 6_738_415_616),
        ("llama-3-8b", 8_030_261_248),
        ("mixtral-8x7b", 46_702_792_704),
        ("qwen2-7b", 7_615_616_512),
    ],
)
def test_public_dense_and_moe_totals(name: str, total: int) -> None:
    """Parameter totals the model cards publish (final norm included: megatron convention)."""
    assert model_total(preset(name), "megatron") == total


def test_v3_with_mtp_is_larger(v3) -> None:
    assert model_total(v3, "megatron", mtp=True) > model_total(v3, "megatron") + 11e9
