"""The DeepSpeed rung: options by failure phase, never a repeat, chosen by predicted saving."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dssup.memory import GiB, Layout, Training, estimate, preset
from dssup.memory.capacity import band
from dssup.supervisor.adapters import RemedyContext
from dssup.supervisor.deepspeed.choice import size
from dssup.supervisor.deepspeed.ckpt_info import read_checkpoint
from dssup.supervisor.deepspeed.ladder import DeepSpeedStep, MemoryContext, options_for
from dssup.supervisor.deepspeed.savings import ParamContext, param_context, predicted_step_time
from dssup.supervisor.modelplan import ModelStep
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.remedies import RemedyPlanner

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


def _peak(mem: MemoryContext, plan: TrainingPlan, phase: str = "optimizer") -> int:
    stage = 1 if phase == "optimizer" and plan.zero_stage == 2 else plan.zero_stage
    t = mem.base.model_copy(
        update={
            "zero_stage": stage,
            "offload_optimizer": plan.offload != "none",
            "offload_params": plan.offload == "optimizer+params",
            "recompute": plan.recompute,
        }
    )
    return estimate(mem.model, mem.layout, t).peak_bytes


@pytest.mark.parametrize("gib", [80, 40, 24])
def test_memory_model_picks_the_fastest_option_that_fits(gib: int) -> None:
    mem = _memory(gib)
    r = DeepSpeedStep(memory=mem).propose(oom("optimizer"), PLAN, ctx(PLAN))
    assert r is not None and r.predicted_peak_bytes is not None
    options = options_for("optimizer", PLAN, scored=True)
    budget = int(mem.gpu_memory_bytes * (1 - mem.margin))
    fitting = [o for o in options if _peak(mem, o.plan) <= budget]
    assert "predicted savings (memory model llama-3-8b)" in r.reason
    for o in options:  # every candidate's predicted saving is in the journal
        assert f"{o.name} saves {size(_peak(mem, PLAN) - _peak(mem, o.plan))}" in r.reason
    if fitting:  # the planner's step time ranks them (dssup.memory.step_time), not a static order
        fastest = min(fitting, key=lambda o: predicted_step_time(mem, o.plan) or float("inf"))
        assert r.step == f"deepspeed:{fastest.name}"
        assert r.predicted_peak_bytes <= budget
        assert f"wins: the fastest predicted to fit {size(budget)} (planner step time" in r.reason
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
    assert "+31.00 GiB seen in the failure" in shifted.reason
    if plain.step != shifted.step:  # the calibrated estimate ruled the cheaper option out
        budget = mem.gpu_memory_bytes * (1 - mem.margin)
        assert _peak(mem, plain.plan) + 31 * GiB > budget


def test_zero2_is_scored_at_the_step_and_predicted_to_save_nothing() -> None:
    at1 = PLAN.model_copy(update={"zero_stage": 1})
    r = DeepSpeedStep(memory=_memory(24)).propose(oom("optimizer"), at1, ctx(at1))
    assert r is not None and "zero-2 saves 0.0 MiB" in r.reason and r.step != "deepspeed:zero-2"
    backward = DeepSpeedStep(memory=_memory(24)).propose(oom("backward"), at1, ctx(at1))
    assert backward is not None and "zero-2 saves 0.0 MiB" not in backward.reason


P = 50_000_000  # parameters of a checkpointed bf16 job


def _params(half: bool = True) -> ParamContext:
    return ParamContext(P, half, "checkpoint global_step2: 50,000,000 parameters")


def test_checkpoint_parameters_pick_zero3_for_an_optimizer_oom_and_say_why() -> None:
    at1 = TrainingPlan(micro_batch=32, grad_accum=1, global_batch=64, dp=2, world_size=2,
                       zero_stage=1)  # fmt: skip
    cpu = RemedyContext(tried=frozenset({at1.key()}), capabilities=CAPS, device="cpu")
    failure = oom("optimizer", FailureKind.HOST_OOM, tried_to_allocate=4 * P // 2)
    r = DeepSpeedStep(params=_params).propose(failure, at1, cpu)
    assert r is not None and r.step == "deepspeed:zero-3"
    half_weights = 2 * P // 2  # ZeRO-3 shards the bf16 weights; gradients are already sharded
    assert r.reason == (
        "optimizer OOM: ZeRO-3 also shards the parameters (gathered layer by layer); "
        "predicted savings (model states at the optimizer phase, checkpoint global_step2: "
        f"50,000,000 parameters): zero-2 saves 0.0 MiB, zero-3 saves {size(half_weights)}; "
        "zero-3 wins: the largest predicted saving; none covers the failed request "
        f"({size(4 * P // 2)})"
    )


def test_checkpoint_parameters_prefer_the_cheapest_that_covers_the_request() -> None:
    gpu = RemedyContext(tried=frozenset({PLAN.key()}), capabilities=CAPS)
    need = 10 << 20  # every option saves more: the cheapest wins
    r = DeepSpeedStep(params=_params).propose(oom("optimizer", tried_to_allocate=need), PLAN, gpu)
    assert r is not None and r.step == "deepspeed:zero-1"
    assert "zero-1 wins: the cheapest that saves the whole failed request" in r.reason
    big = 100 * P  # nothing covers it: the largest saving (offloading everything)
    r = DeepSpeedStep(params=_params).propose(oom("optimizer", tried_to_allocate=big), PLAN, gpu)
    assert r is not None and r.step == "deepspeed:offload-params"


@pytest.mark.parametrize(
    ("memory", "params", "phase", "why"),
    [
        (False, False, "optimizer", "no memory context: no --model and no checkpoint"),
        (False, True, "backward", "a parameter count predicts no saving of activations"),
    ],
)
def test_static_order_is_the_stated_fallback(
    memory: bool, params: bool, phase: str, why: str
) -> None:
    step = DeepSpeedStep(params=_params if params else None)
    r = step.propose(oom(phase), PLAN, ctx(PLAN))
    first = options_for(phase, PLAN)[0].name
    assert r is not None and r.step == f"deepspeed:{first}"
    assert f"static order for the {phase} phase ({why}" in r.reason
    assert r.reason.endswith(f"{first} is first")


def test_the_planner_hands_the_model_description_to_the_deepspeed_rung() -> None:
    mem = _memory(40)
    model_step = ModelStep(model=mem.model, layout=mem.layout, base=mem.base,
                           gpu_memory_bytes=mem.gpu_memory_bytes)  # fmt: skip
    rung = DeepSpeedStep()
    RemedyPlanner.default(model_step, [rung])
    assert rung.memory == mem
    untouched = DeepSpeedStep()
    RemedyPlanner.default(None, [untouched])
    assert untouched.memory is None


@pytest.mark.parametrize(
    ("name", "params"), [("zero0-dp2", None), ("zero1-dp2", 45), ("zero3-dp2", 45)]
)
def test_parameter_count_comes_from_a_real_checkpoint(name: str, params: int | None) -> None:
    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed"
    found = param_context(read_checkpoint(fixtures / name))  # d_in 4, width 4, depth 1: 45
    assert (found and found.params) == params  # ZeRO-0 records no parameter shapes
    assert param_context(None) is None


def test_an_option_near_the_limit_wins_and_its_rule_says_so() -> None:
    """No default margin (capacity.py): on 46 GiB ZeRO-3 peaks at ~97 % of the GPU and is the
    fastest that fits; a 5 % margin would have sent the job to parameter offload. The rule
    names the memory model's band and its source; with room to spare it does not."""
    b = band("megatron")
    mem = _memory(46)
    r = DeepSpeedStep(memory=mem).propose(oom("optimizer"), PLAN, ctx(PLAN))
    assert r is not None and r.step == "deepspeed:zero-3" and r.predicted_peak_bytes is not None
    assert r.predicted_peak_bytes > mem.gpu_memory_bytes * (1 - b.fraction)
    assert "near the limit" in r.reason and b.source in r.reason
    kept = DeepSpeedStep(memory=replace(mem, margin=0.05)).propose(
        oom("optimizer"), PLAN, ctx(PLAN)
    )
    assert kept is not None and kept.step != "deepspeed:zero-3"
    roomy = DeepSpeedStep(memory=_memory(60)).propose(oom("optimizer"), PLAN, ctx(PLAN))
    assert roomy is not None and "near the limit" not in roomy.reason
