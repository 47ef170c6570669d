"""The remedy ladder: cheapest first, global batch exact, never a config that already failed."""

from hypothesis import given
from hypothesis import strategies as st

from dssup.memory import GiB, Layout, Overheads, Training, estimate, preset
from dssup.supervisor.adapters import BUILTIN_CAPABILITIES, RemedyContext
from dssup.supervisor.modelplan import ModelStep, to_training
from dssup.supervisor.models import Failure, FailureKind, Remedy, TrainingPlan
from dssup.supervisor.remedies import RemedyPlanner

PLAN = TrainingPlan(micro_batch=16, grad_accum=1, global_batch=32, dp=2, world_size=2)
CTX = RemedyContext(frozenset(), BUILTIN_CAPABILITIES, "cpu")
CPU_OOM = Failure(kind=FailureKind.HOST_OOM, rank=1, tried_to_allocate=6 << 20)


def test_halves_micro_batch_doubles_accumulation():
    r = RemedyPlanner.default().decide(CPU_OOM, PLAN, CTX)
    assert r.step == "halve-micro-batch"
    assert (r.plan.micro_batch, r.plan.grad_accum, r.plan.global_batch) == (8, 2, 32)


def test_never_repeats_a_failed_config_and_stops_when_nothing_is_left():
    planner, plan, tried, steps = RemedyPlanner.default(), PLAN, set(), []
    while True:
        tried.add(plan.key())
        r = planner.decide(
            CPU_OOM, plan, RemedyContext(frozenset(tried), BUILTIN_CAPABILITIES, "cpu")
        )
        if r is None:
            break
        assert r.plan.key() not in tried
        assert r.plan.global_batch == 32
        assert r.plan.micro_batch * r.plan.grad_accum * r.plan.dp == 32
        steps.append((r.step, r.plan.micro_batch, r.plan.recompute))
        plan = r.plan
    assert steps == [
        ("halve-micro-batch", 8, "none"),
        ("halve-micro-batch", 4, "none"),
        ("halve-micro-batch", 2, "none"),
        ("halve-micro-batch", 1, "none"),
        ("recompute", 1, "selective"),
        ("recompute", 1, "full"),
    ]


def test_odd_share_uses_the_next_divisor():
    plan = TrainingPlan(micro_batch=6, grad_accum=2, global_batch=24, dp=2)
    r = RemedyPlanner.default().decide(CPU_OOM, plan, CTX)
    assert (r.plan.micro_batch, r.plan.grad_accum) == (3, 4)


def test_fragmentation_gets_the_allocator_setting_first():
    f = Failure(kind=FailureKind.CUDA_OOM, tried_to_allocate=2 << 30, reserved_unallocated=3 << 30)
    r = RemedyPlanner.default().decide(f, PLAN, CTX)
    assert r.step == "alloc-conf" and r.plan.expandable_segments
    assert r.plan.micro_batch == 16
    small = f.model_copy(update={"reserved_unallocated": 1 << 30})
    assert RemedyPlanner.default().decide(small, PLAN, CTX).step == "halve-micro-batch"


def test_load_oom_loads_to_cpu_not_a_batch_cut():
    f = Failure(kind=FailureKind.LOAD_OOM, phase="load")
    r = RemedyPlanner.default().decide(f, PLAN, CTX)
    assert r.step == "load-to-cpu" and r.plan.micro_batch == 16
    assert RemedyPlanner.default().decide(f, r.plan, CTX) is None


def test_host_oom_on_a_gpu_job_is_not_an_activation_problem():
    gpu = RemedyContext(frozenset(), BUILTIN_CAPABILITIES, "cuda")
    assert RemedyPlanner.default().decide(CPU_OOM, PLAN, gpu) is None
    assert RemedyPlanner.default().decide(Failure(kind=FailureKind.COMM_OOM), PLAN, CTX) is None


class ZeroUp:
    """What an adapter rung looks like (the DeepSpeed helper plugs in the same way)."""

    name = "zero-stage"

    def propose(self, failure, plan, ctx):
        if "zero_stage" not in ctx.capabilities or plan.zero_stage >= 3:
            return None
        return Remedy(
            step=self.name,
            plan=plan.model_copy(update={"zero_stage": plan.zero_stage + 1}),
            reason="shard more",
        )


def test_adapter_rungs_come_after_the_builtin_ones():
    planner = RemedyPlanner.default(extra=[ZeroUp()])
    one = TrainingPlan(micro_batch=1, grad_accum=16, global_batch=32, dp=2, recompute="full")
    ctx = RemedyContext(frozenset(), BUILTIN_CAPABILITIES | {"zero_stage"}, "cpu")
    r = planner.decide(CPU_OOM, one, ctx)
    assert r.step == "zero-stage" and r.plan.zero_stage == 1


def test_optimizer_step_oom_goes_to_zero_before_the_micro_batch():
    planner = RemedyPlanner.default(extra=[ZeroUp()])
    ctx = RemedyContext(frozenset(), BUILTIN_CAPABILITIES | {"zero_stage"}, "cpu")
    step_oom = CPU_OOM.model_copy(update={"phase": "optimizer"})
    r = planner.decide(step_oom, PLAN, ctx)
    assert r.step == "zero-stage" and r.plan.micro_batch == PLAN.micro_batch
    # without a ZeRO rung the activation rungs still run, last
    r = RemedyPlanner.default().decide(step_oom, PLAN, CTX)
    assert r.step == "halve-micro-batch"
    # a forward/backward OOM keeps the cheap activation rungs first
    r = planner.decide(CPU_OOM.model_copy(update={"phase": "forward"}), PLAN, ctx)
    assert r.step == "halve-micro-batch"


@given(
    mb=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 48]),
    dp=st.integers(1, 8),
    acc=st.integers(1, 6),
)
def test_global_batch_is_invariant(mb, dp, acc):
    plan = TrainingPlan(micro_batch=mb, grad_accum=acc, global_batch=mb * acc * dp, dp=dp)
    r = RemedyPlanner.default().decide(CPU_OOM, plan, CTX)
    if r is not None:
        assert r.plan.micro_batch * r.plan.grad_accum * dp == plan.global_batch


def _model_step():
    model = preset("llama-3-8b")
    return ModelStep(
        model=model,
        layout=Layout(tp=1, pp=1, dp=8),
        base=Training(seq_len=4096),
        gpu_memory_bytes=80 * GiB,
    )


def test_memory_model_rung_calibrates_to_the_observed_oom():
    step = _model_step()
    plan = TrainingPlan(
        micro_batch=4, grad_accum=8, global_batch=256, dp=8, world_size=8, zero_stage=1
    )
    predicted = estimate(step.model, step.layout, to_training(plan, step.base)).peak_bytes
    f = Failure(kind=FailureKind.CUDA_OOM, tried_to_allocate=4 << 30, in_use_bytes=79 * GiB)
    ctx = RemedyContext(frozenset({plan.key()}), BUILTIN_CAPABILITIES, "cuda")
    r = RemedyPlanner.default(step).decide(f, plan, ctx)
    assert r is not None and r.step == "memory-model"
    assert r.calibration_bytes == max(0, 83 * GiB - predicted)
    assert r.plan.global_batch == 256 and r.plan.zero_stage == 1  # no DeepSpeed adapter: stage kept
    assert r.plan.micro_batch * r.plan.grad_accum * 8 == 256
    assert r.predicted_peak_bytes <= 0.95 * 80 * GiB
    again = estimate(
        step.model,
        step.layout,
        to_training(r.plan, step.base),
        overheads=Overheads(calibration_bytes=r.calibration_bytes),
    ).peak_bytes
    assert again == r.predicted_peak_bytes


def test_memory_model_rung_uses_zero_only_with_an_adapter_that_can():
    step = _model_step()
    plan = TrainingPlan(
        micro_batch=1, grad_accum=32, global_batch=256, dp=8, world_size=8, recompute="full"
    )
    f = Failure(kind=FailureKind.CUDA_OOM, tried_to_allocate=1 << 30, in_use_bytes=80 * GiB)
    tried = frozenset({plan.key()})
    plain = RemedyPlanner.default(step).decide(f, plan, RemedyContext(tried, BUILTIN_CAPABILITIES))
    caps = BUILTIN_CAPABILITIES | {"zero_stage", "offload"}
    ds = RemedyPlanner.default(step).decide(f, plan, RemedyContext(tried, caps))
    assert plain is None or plain.plan.zero_stage == 0
    assert ds is not None and (ds.plan.zero_stage > 0 or ds.plan.offload != "none")


def test_memory_model_rung_answers_an_optimizer_step_oom_with_zero_or_offload_only():
    step = _model_step()
    plan = TrainingPlan(
        micro_batch=4, grad_accum=8, global_batch=256, dp=8, world_size=8, zero_stage=1
    )
    f = Failure(
        kind=FailureKind.CUDA_OOM,
        tried_to_allocate=4 << 30,
        in_use_bytes=79 * GiB,
        phase="optimizer",
    )
    tried = frozenset({plan.key()})
    builtin = RemedyContext(tried, BUILTIN_CAPABILITIES, "cuda")
    assert step.propose(f, plan, builtin) is None  # no adapter can change ZeRO or offload
    same_fault_in_backward = f.model_copy(update={"phase": "backward"})
    assert step.propose(same_fault_in_backward, plan, builtin) is not None  # micro-batch helps
    caps = BUILTIN_CAPABILITIES | {"zero_stage", "offload"}
    r = step.propose(f, plan, RemedyContext(tried, caps, "cuda"))
    assert r is not None and (r.plan.zero_stage, r.plan.offload) != (1, "none")
    assert r.plan.micro_batch * r.plan.grad_accum * 8 == 256
