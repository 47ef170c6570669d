"""Re-planning on a membership change: global batch exact, memory raised before an OOM."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dssup.elastic import BatchPlan, MemoryContext, replan, rescale, search_plans
from dssup.memory import GiB, Training, preset
from dssup.memory.capacity import band


def _plan(mb: int, gas: int, dp: int, zero: int = 1, mp: int = 1) -> BatchPlan:
    return BatchPlan(
        micro_batch=mb,
        grad_accum=gas,
        global_batch=mb * gas * dp,
        dp=dp,
        world_size=dp * mp,
        zero_stage=zero,
    )


plans = st.builds(
    _plan,
    mb=st.integers(1, 16),
    gas=st.integers(1, 16),
    dp=st.integers(1, 64),
    mp=st.sampled_from([1, 2, 4]),
)


@settings(max_examples=300, deadline=None)
@given(plans, st.integers(1, 256))
def test_rescale_keeps_the_batch_or_refuses(plan: BatchPlan, world: int) -> None:
    new = rescale(plan, world)
    mp = plan.model_parallel
    if world % mp or plan.global_batch % (world // mp):
        assert new is None
        assert replan(plan, world).action == "incompatible"
        return
    assert new is not None
    assert new.micro_batch * new.grad_accum * new.dp == plan.global_batch
    assert new.world_size == world and new.model_parallel == mp
    assert new.micro_batch <= plan.micro_batch
    assert (new.zero_stage, new.recompute, new.offload) == (
        plan.zero_stage,
        plan.recompute,
        plan.offload,
    )
    if (plan.global_batch // new.dp) % plan.micro_batch == 0:
        assert new.micro_batch == plan.micro_batch  # more accumulation, same activations


def test_shrink_without_a_model_doubles_accumulation() -> None:
    r = replan(_plan(4, 2, 16), 8)
    assert r.action == "rescale" and r.plan is not None
    assert (r.plan.micro_batch, r.plan.grad_accum, r.plan.dp) == (4, 4, 8)
    back = replan(r.plan, 16)
    assert back.plan == _plan(4, 2, 16)


CTX = MemoryContext(model=preset("llama-3-8b"), base=Training(seq_len=4096), gpu_memory_bytes=1)


def _tight(plan: BatchPlan) -> MemoryContext:
    """A GPU just big enough for ``plan`` (and the margin, none by default): the old world fits
    by a hair."""
    need = CTX.peak(plan)
    return CTX.model_copy(update={"gpu_memory_bytes": int(need / (1 - CTX.margin)) + 2})


@pytest.mark.parametrize("zero", [1, 2])
def test_shrink_that_would_not_fit_raises_memory_savings_first(zero: int) -> None:
    current = _plan(1, 2, 128, zero=zero)
    ctx = _tight(current)
    assert ctx.fits(current)
    r = replan(current, 16, baseline=current, memory=ctx)
    assert r.naive is not None and r.naive_peak_bytes is not None
    assert r.naive_peak_bytes > ctx.budget, "the naive restart must be predicted to OOM"
    assert r.action == "raise-memory" and r.plan is not None
    assert r.plan.global_batch == current.global_batch and r.plan.dp == 16
    assert ctx.peak(r.plan) == r.predicted_peak_bytes <= ctx.budget
    assert r.plan.zero_stage >= zero  # never lowered pre-emptively
    assert set(r.changes()) & {"zero_stage", "recompute", "offload", "micro_batch"}


def test_growth_relaxes_back_to_the_users_plan() -> None:
    user = _plan(1, 2, 128, zero=1)
    ctx = _tight(user)
    small = replan(user, 16, baseline=user, memory=ctx)
    assert small.plan is not None and small.plan.knobs() != rescale(user, 16).knobs()  # type: ignore[union-attr]
    back = replan(small.plan, 128, baseline=user, memory=ctx)
    assert back.action == "relax"
    assert back.plan == user


def test_failed_knobs_are_never_proposed_again() -> None:
    current = _plan(1, 2, 128, zero=1)
    ctx = _tight(current)
    first = replan(current, 16, baseline=current, memory=ctx)
    assert first.plan is not None
    again = replan(current, 16, baseline=current, memory=ctx, exclude={first.plan.knobs()})
    assert again.plan is None or again.plan.knobs() != first.plan.knobs()


def test_nothing_fits_is_data() -> None:
    current = _plan(1, 1, 8, zero=3)
    tiny = CTX.model_copy(update={"gpu_memory_bytes": 1 * GiB})
    r = replan(current, 8, memory=tiny)
    assert r.action == "no-fit" and r.plan is None and "nothing fits" in r.reason


def test_a_plan_near_the_limit_says_so_with_the_band_and_its_source() -> None:
    """No margin by default (capacity.py): the user's plan that fits by a hair is taken back,
    and the reason names the memory model's band and its source; with room to spare it
    does not."""
    user = _plan(1, 2, 128, zero=1)
    ctx = _tight(user)
    small = replan(user, 16, baseline=user, memory=ctx)
    assert small.plan is not None
    back = replan(small.plan, 128, baseline=user, memory=ctx)
    b = band("megatron")
    assert back.action == "relax" and "near the limit" in back.reason and b.source in back.reason
    roomy = ctx.model_copy(update={"gpu_memory_bytes": 2 * ctx.gpu_memory_bytes})
    assert "near the limit" not in replan(user, 128, memory=roomy).reason
    near = [f for f in search_plans(ctx, 128, user.global_batch) if f.near is not None]
    assert near and all(f.peak_bytes > ctx.gpu_memory_bytes * (1 - b.fraction) for f in near)
    assert {f.near.source for f in near} == {b.source}  # type: ignore[union-attr]
