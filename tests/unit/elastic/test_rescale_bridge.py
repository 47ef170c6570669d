"""The supervisor's bridge to elastic re-planning, and leader failover while followers wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from dssup.memory import GiB, Layout, Training, preset
from dssup.supervisor.modelplan import ModelStep
from dssup.supervisor.models import TrainingPlan
from dssup.supervisor.multinode.rescale import memory_context, rescale_plan, to_batch
from dssup.supervisor.remedies import RemedyPlanner

from .test_agreement import _agreement

USER = TrainingPlan(micro_batch=1, grad_accum=2, global_batch=256, dp=128, world_size=128,
                    zero_stage=1)  # fmt: skip


def _planner(gpu: int) -> RemedyPlanner:
    step = ModelStep(
        model=preset("llama-3-8b"), layout=Layout(dp=128), base=Training(seq_len=4096),
        gpu_memory_bytes=gpu,
    )  # fmt: skip
    return RemedyPlanner.default(step)


def _tight() -> int:
    """A GPU on which the user's plan fits at 128 GPUs with 5 % to spare."""
    ctx = memory_context(_planner(80 * GiB), frozenset({"zero_stage"}))
    assert ctx is not None
    bp = to_batch(USER)
    assert bp is not None
    return int(ctx.peak(bp) / 0.95) + 2


def test_shrink_raises_zero_through_the_supervisor_bridge() -> None:
    gpu = _tight()
    ctx = memory_context(_planner(gpu), frozenset({"zero_stage", "offload"}))
    plan, verdict = rescale_plan(USER, USER, 16, ctx)
    assert verdict is not None and verdict.action == "raise-memory"
    assert plan.world_size == 16 and plan.dp == 16 and plan.global_batch == 256
    assert plan.micro_batch * plan.grad_accum * plan.dp == 256
    assert plan.zero_stage >= 1 and (plan.zero_stage, plan.recompute, plan.offload) != (
        1,
        "none",
        "none",
    )
    back, verdict2 = rescale_plan(plan, USER, 128, ctx)
    assert verdict2 is not None and verdict2.action == "relax" and back == USER


def test_without_zero_capability_only_batch_and_recompute_change() -> None:
    gpu = _tight()
    ctx = memory_context(_planner(gpu), frozenset())  # no DeepSpeed adapter: ZeRO is fixed
    plan, verdict = rescale_plan(USER, USER, 16, ctx)
    assert verdict is not None
    assert plan.zero_stage == 1 and plan.offload == "none"


def test_failed_configs_are_excluded_after_a_shrink() -> None:
    gpu = _tight()
    ctx = memory_context(_planner(gpu), frozenset({"zero_stage", "offload"}))
    first, _ = rescale_plan(USER, USER, 16, ctx)
    again, _ = rescale_plan(USER, USER, 16, ctx, tried={first.key()})
    assert again.key() != first.key()


def test_unpinned_batch_is_left_alone() -> None:
    loose = TrainingPlan(world_size=4, dp=4)
    plan, verdict = rescale_plan(loose, loose, 2, None)
    assert verdict is None and plan.world_size == 2


def test_a_follower_takes_over_when_the_leader_goes_silent(tmp_path: Path) -> None:
    a, b = _agreement(tmp_path, 0, settle=0.2), _agreement(tmp_path, 1, settle=0.2)
    a.members.set("waiting", 1)  # node 0 announces itself once, then dies (no more beats)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(b.wait_for(1)))
    t0 = time.monotonic()
    b.members.start()  # the follower's heartbeat thread, as in dssup run
    try:
        t.start()
        t.join(timeout=20)
    finally:
        b.members.stop()
    d = got[0]
    assert d is not None and d.leader == 1 and d.nodes == (1,)  # type: ignore[attr-defined]
    assert time.monotonic() - t0 >= b.cfg.member_timeout_s * 0.9  # waited for staleness
