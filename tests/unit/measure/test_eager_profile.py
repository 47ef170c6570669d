"""The eager implementation profile inside the pure memory model: exact arithmetic, no torch."""

from __future__ import annotations

import pytest

from dssup.memory import (
    Layout,
    ModelSpec,
    Overheads,
    PlanRequest,
    Precision,
    Training,
    estimate,
    plan,
)
from dssup.memory.activations import keep
from dssup.memory.profile import EagerProfile, LayerCoefficients, LevelBytes

MODEL = ModelSpec(
    name="t", hidden=256, ffn=688, layers=4, heads=4, kv_heads=2, head_dim=64, vocab=4096
)
FP32 = Precision(weights=4, gradients=4, master=0, moments=4, activations=4)
NONE = Overheads(comm_buffer_bytes=0, fragmentation=0.0, cuda_context_bytes=0)


def _lv(a: int, b: int, c: int) -> LevelBytes:
    return LevelBytes(none=a, selective=b, full=c)


PROFILE = EagerProfile(
    source="hand-made for the test",
    seq_len=256,
    dtype="fp32",
    optimizer="foreach",
    dense=LayerCoefficients(per_sample=_lv(1000, 600, 100), constant=_lv(10, 10, 10)),
    stage=LayerCoefficients(per_sample=_lv(5000, 5000, 5200), constant=_lv(70, 70, 70)),
    optimizer_transient_per_param=4.0,
)
PARAMS = 4 * (2 * 256 + 256 * 256 * 2 + 2 * 256 * 128 + 3 * 256 * 688) + 2 * 4096 * 256 + 256


def _est(**kw: object) -> tuple[int, str]:
    args: dict[str, object] = {"seq_len": 256, "precision": FP32, "implementation": PROFILE}
    t = Training.model_validate(args | kw)
    e = estimate(MODEL, Layout(), t, NONE)
    return e.peak.bytes.allocated, e.peak_phase


@pytest.mark.parametrize(("rc", "per", "const"), [("none", 1000, 10), ("full", 100, 10)])
def test_forward_backward_peak_is_w_plus_o_plus_fitted_terms(rc: str, per: int, const: int) -> None:
    b = 10_000  # large enough that activations dominate the optimizer step
    peak, phase = _est(micro_batch=b, recompute=rc)
    stage = PROFILE.stage.per_sample.at(rc)
    expected = PARAMS * (4 + 8) + b * (4 * per + stage) + 4 * const + 70
    assert (peak, phase) == (expected, "forward-backward")


def test_optimizer_step_peak_counts_gradients_and_foreach_temporaries() -> None:
    peak, phase = _est(micro_batch=1)
    assert (peak, phase) == (PARAMS * (4 + 4 + 8 + 4), "optimizer-step")


def test_gradients_count_in_forward_when_accumulating() -> None:
    one, _ = _est(micro_batch=10_000, grad_accum=1)
    two, _ = _est(micro_batch=10_000, grad_accum=2)
    assert two - one == PARAMS * 4


def test_sequence_scaling_and_offload() -> None:
    base, _ = _est(micro_batch=10_000)
    double, _ = _est(micro_batch=10_000, seq_len=512)
    assert double - base == 10_000 * (4 * 1000 + 5000)  # per-sample terms are linear in s
    off, phase = _est(micro_batch=1, offload_optimizer=True)
    assert phase == "optimizer-step" and off == PARAMS * (4 + 4)  # W + G on the device


def test_keep_selects_exactly_one_eager_level() -> None:
    for level in ("none", "selective", "full"):
        kept = [g for g in ("eager:none", "eager:selective", "eager:full") if keep(g, level)]  # type: ignore[arg-type]
        assert kept == [f"eager:{level}"]


def test_profile_json_round_trip_and_unknown_fields_rejected() -> None:
    text = PROFILE.model_dump_json()
    assert EagerProfile.model_validate_json(text) == PROFILE
    with pytest.raises(ValueError, match="extra"):
        EagerProfile.model_validate_json(text.replace('"kind"', '"surprise":1,"kind"'))


# The end of backward: every gradient plus the first block's and the embedding's backward.
TAIL = PROFILE.model_copy(
    update={
        "end_of_backward": LayerCoefficients(
            per_sample=_lv(900, 700, 500), constant=_lv(-300, -300, 1_000)
        )
    }
)


def _tail_est(**kw: object) -> tuple[int, str]:
    return _est(implementation=TAIL, **kw)


def test_end_of_backward_tops_an_offloaded_optimizer_step() -> None:
    peak, phase = _tail_est(micro_batch=1, recompute="full", offload_optimizer=True)
    assert (peak, phase) == (PARAMS * (4 + 4) + 500 + 1_000, "forward-backward")


def test_end_of_backward_below_the_optimizer_step_changes_nothing() -> None:
    assert _tail_est(micro_batch=1, recompute="full") == _est(micro_batch=1, recompute="full")
    big = {"micro_batch": 10_000, "recompute": "none"}  # the start of backward dominates
    assert _tail_est(**big, offload_optimizer=True) == _est(**big, offload_optimizer=True)


def test_end_of_backward_per_sample_bytes_scale_with_micro_batch_and_sequence() -> None:
    off = {"recompute": "full", "offload_optimizer": True}
    one, _ = _tail_est(micro_batch=1, **off)
    two, _ = _tail_est(micro_batch=2, **off)
    longer, _ = _tail_est(micro_batch=1, seq_len=512, **off)
    assert (two - one, longer - one) == (500, 500)


def test_end_of_backward_with_accumulation_keeps_gradients_once() -> None:
    peak, _ = _tail_est(micro_batch=1, recompute="full", offload_optimizer=True, grad_accum=2)
    # G is already in the forward/backward states: the start of backward (5600 + 110) stays
    # the peak; counting G twice at the end of backward would top it by PARAMS * 4.
    assert peak == PARAMS * (4 + 4) + 100 * 4 + 5200 + 4 * 10 + 70


def test_planner_agrees_with_estimate_on_the_end_of_backward() -> None:
    t = Training(seq_len=256, precision=FP32, implementation=TAIL, recompute="full")
    req = PlanRequest(
        model=MODEL,
        gpu_memory_bytes=PARAMS * (4 + 4) + 1_600,  # exactly room for micro-batch 1, offloaded
        global_batch=1,
        world_size=1,
        training=t,
        overheads=NONE,
        recompute=("full",),
        zero_stages=(0,),
        margin=0.0,
        limit=100,
    )
    res = plan(req)
    assert [(c.training.micro_batch, c.training.offload_optimizer) for c in res.candidates] == [
        (1, True)
    ]
    c = res.candidates[0]
    e = estimate(MODEL, c.layout, c.training, NONE)
    assert (
        (c.peak_bytes, c.phase)
        == (e.peak_bytes, e.peak_phase)
        == (PARAMS * 8 + 1_500, "forward-backward")
    )


def test_profile_without_end_of_backward_still_loads() -> None:
    old = PROFILE.model_dump(mode="json")
    del old["end_of_backward"]
    assert EagerProfile.model_validate(old).end_of_backward is None
