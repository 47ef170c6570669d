"""The DeepSpeed rung: options by failure phase, never a repeat, chosen by the memory model."""

from __future__ import annotations

import pytest

from dssup.memory import GiB, Layout, Training, estimate, preset
from dssup.supervisor.adapters import RemedyContext
from dssup.supervisor.deepspeed.ladder import DeepSpeedStep, MemoryContext, options_for
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan

PLAN = TrainingPlan(micro_batch=1, grad_accum=8, global_batch=64, dp=8, world_size=8)
CAPS = frozenset({"micro_batch", "grad_accum", "recompute", "zero_stage", "offload"})


def oom(phase: str, kind: FailureKind = FailureKind.CUDA_OOM, **kw: int) -> Failure:
    return Failure.model_validate({"kind": kind, "phase": phase, **kw})


def ctx(*tried: TrainingPlan, caps: frozenset[str] = CAPS) -> RemedyContext:
    return RemedyContext(tried=frozenset(p.key() for p in tried), capabilities=caps)


@pytest.mark.parametrize(
    ("phase", "first", "excluded"),
    [
        ("optimizer", "zero-1", "recompute"),  # an optimizer-step OOM never goes to recompute
        ("forward", "recompute", None),
        ("backward", "recompute", None),
        ("load", "zero-3", "recompute"),
        ("", "recompute", None),
    ],
)
def test_options_follow_the_phase(phase: str, first: str, excluded: str | None) -> None:
    names = [o.name for o in options_for(phase, PLAN)]
    assert names[0] == first
    assert excluded not in names
    for o in options_for(phase, PLAN):
        assert o.plan.global_batch == PLAN.global_batch
        assert o.plan.micro_batch == PLAN.micro_batch  # the batch is never this rung's knob


def test_climbs_one_rung_at_a_time_without_repeats() -> None:
    step, plan, tried = DeepSpeedStep(), PLAN, [PLAN]
    seen = []
    while (r := step.propose(oom("optimizer"), plan, ctx(*tried))) is not None:
        seen.append(r.step)
        assert r.plan.key() not in {p.key() for p in tried}
        assert "optimizer OOM" in r.reason
        plan = r.plan
        tried.append(plan)
    assert seen == [
        "deepspeed:zero-1",
        "deepspeed:offload-optimizer",
        "deepspeed:zero-3",
        "deepspeed:offload-params",
    ]
    assert (plan.zero_stage, plan.offload) == (3, "optimizer+params")


def test_zero2_is_no_optimizer_step_remedy_and_cpu_jobs_never_offload() -> None:
    at1 = PLAN.model_copy(update={"zero_stage": 1})
    assert [o.name for o in options_for("optimizer", at1)] == [
        "offload-optimizer",
        "zero-3",
        "offload-params",
    ]
    assert [o.name for o in options_for("optimizer", at1, device="cpu")] == ["zero-3"]
    assert "zero-2" in [o.name for o in options_for("backward", at1)]
    cpu = RemedyContext(tried=frozenset({at1.key()}), capabilities=CAPS, device="cpu")
    r = DeepSpeedStep().propose(oom("optimizer", FailureKind.HOST_OOM), at1, cpu)
    assert r is not None and (r.step, r.plan.zero_stage) == ("deepspeed:zero-3", 3)


def test_offload_needs_zero_and_params_need_stage_3() -> None:
    names = {o.name: o.plan for o in options_for("optimizer", PLAN)}
    assert names["offload-optimizer"].zero_stage == 1
    assert names["offload-params"].zero_stage == 3


def test_not_for_other_failures_nor_without_capabilities() -> None:
    step = DeepSpeedStep()
    assert step.propose(oom("optimizer", FailureKind.USER_ERROR), PLAN, ctx()) is None
    no_zero = frozenset({"micro_batch", "grad_accum", "recompute"})
    assert step.propose(oom("optimizer"), PLAN, ctx(caps=no_zero)) is None
    r = step.propose(oom("forward"), PLAN, ctx(caps=no_zero))
    assert r is not None and r.step == "deepspeed:recompute"
    assert step.propose(oom("optimizer", FailureKind.HOST_OOM), PLAN, ctx()) is not None


def _memory(gib: int) -> MemoryContext:
    return MemoryContext(
        model=preset("llama-3-8b"),
        layout=Layout(dp=8),
        base=Training(seq_len=4096, micro_batch=1, grad_accum=8),
        gpu_memory_bytes=gib * GiB,
    )


def _peak(mem: MemoryContext, plan: TrainingPlan) -> int:
    t = mem.base.model_copy(
        update={
            "zero_stage": plan.zero_stage,
            "offload_optimizer": plan.offload != "none",
            "offload_params": plan.offload == "optimizer+params",
            "recompute": plan.recompute,
        }
    )
    return estimate(mem.model, mem.layout, t).peak_bytes


@pytest.mark.parametrize("gib", [80, 40, 24])
def test_memory_model_picks_the_cheapest_option_that_fits(gib: int) -> None:
    mem = _memory(gib)
    r = DeepSpeedStep(memory=mem).propose(oom("optimizer"), PLAN, ctx(PLAN))
    assert r is not None and r.predicted_peak_bytes is not None
    options = options_for("optimizer", PLAN)
    budget = mem.gpu_memory_bytes * (1 - mem.margin)
    fitting = [o for o in options if _peak(mem, o.plan) <= budget]
    if fitting:
        assert r.step == f"deepspeed:{fitting[0].name}"
        assert r.predicted_peak_bytes <= budget and "fits" in r.reason
    else:
        best = min(options, key=lambda o: _peak(mem, o.plan))
        assert r.step == f"deepspeed:{best.name}" and "nothing predicted to fit" in r.reason


def test_observed_failure_shifts_the_prediction() -> None:
    mem = _memory(80)
    now = _peak(mem, PLAN)
    plain = DeepSpeedStep(memory=mem).propose(oom("optimizer"), PLAN, ctx(PLAN))
    shifted = DeepSpeedStep(memory=mem).propose(
        oom("optimizer", in_use_bytes=now + 30 * GiB, tried_to_allocate=GiB), PLAN, ctx(PLAN)
    )
    assert plain is not None and shifted is not None
    assert plain.predicted_peak_bytes is not None and shifted.predicted_peak_bytes is not None
    assert shifted.predicted_peak_bytes == _peak(mem, shifted.plan) + 31 * GiB
    if plain.step != shifted.step:  # the calibrated estimate ruled the cheaper option out
        budget = mem.gpu_memory_bytes * (1 - mem.margin)
        assert _peak(mem, plain.plan) + 31 * GiB > budget
