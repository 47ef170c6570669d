"""A recovery an adapter judges broken fails the run, even though training then finishes.

Real torchrun (2 gloo ranks) and the real supervisor loop; the adapter below is a minimal
framework adapter of this test (no framework is needed to produce a loss curve): its ``assess``
reads the attempts' real console logs with dssup's loss parser and judges them with the same
``check_continuity`` the DeepSpeed adapter uses, as if attempt 2 had resumed from step 2. The
worker's losses after the resume sit far above the trend, so the supervisor must journal a
``continuity`` record with ``ok: false`` and end the run ``recovery-failed`` with exit status 3.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sup_helpers import WORKERS

from dssup.supervisor.adapters import AppliedPlan, RemedyStep
from dssup.supervisor.command import LaunchCommand, parse_command
from dssup.supervisor.config import SupervisorConfig
from dssup.supervisor.deepspeed.assess import attempt_losses
from dssup.supervisor.deepspeed.continuity import check_continuity
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import TrainingPlan
from dssup.supervisor.remedies import RemedyPlanner
from dssup.supervisor.story import story
from dssup.supervisor.supervisor import RECOVERY_FAILED, Supervisor

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]


class LossCheck:
    """Judges attempt 2 onwards as a resume from step 2 (see the module docstring)."""

    name = "loss-check"
    capabilities: frozenset[str] = frozenset()

    def initial_plan(self, command: LaunchCommand, plan: TrainingPlan) -> TrainingPlan:
        return plan

    def remedy_steps(self) -> list[RemedyStep]:
        return []

    def apply(
        self,
        plan: TrainingPlan,
        command: LaunchCommand,
        script_args: list[str],
        attempt_dir: Path,
    ) -> AppliedPlan:
        return AppliedPlan()

    def checkpoint_dirs(self, command: LaunchCommand) -> list[Path]:
        return []

    def assess(self, attempt_dir: Path) -> dict[str, Any] | None:
        earlier = sorted(p for p in attempt_dir.parent.glob("attempt-*") if p < attempt_dir)
        if not earlier:
            return None
        before = [p for d in earlier for p in attempt_losses(d)]
        return check_continuity(before, attempt_losses(attempt_dir), 2).model_dump(mode="json")


def test_a_loss_jump_after_resume_fails_the_finished_run(tmp_path: Path) -> None:
    argv = ["torchrun", "--standalone", "--nproc-per-node", "2", str(WORKERS / "loss_jump.py")]
    plan = TrainingPlan(dp=2, world_size=2)
    config = SupervisorConfig(
        run_id=f"run-{uuid.uuid4().hex[:8]}",
        run_dir=tmp_path / "run",
        command=argv,
        initial_plan=plan,
        device="cpu",
        backoff_initial_s=0.2,
        # torchrun tears attempt 1 down itself: with fast-fail, dssup's SIGKILL at rank 1's error
        # file can cut off rank 0's already printed losses on their way into torchrun.log.
        fast_fail=False,
    )
    sup = Supervisor(config, parse_command(argv), RemedyPlanner.default(), [LossCheck()])
    outcome = sup.run()
    journal = Journal(config.run_dir)
    ended = [r["failure"] and r["failure"]["kind"] for r in journal.of_type("attempt-ended")]
    assert ended == ["transient", None]
    (judged,) = journal.of_type("continuity")
    assert judged["attempt"] == 2 and judged["adapter"] == "loss-check"
    assert judged["verdict"] == "jump" and judged["ok"] is False
    assert judged["redo_steps"] == 2  # steps 3 and 4 ran twice and disagree
    run_ended = journal.last("run-ended")
    assert run_ended is not None and run_ended["outcome"] == "recovery-failed"
    assert outcome.exit_code == RECOVERY_FAILED == run_ended["exit_code"] == 3
    assert "the recovery failed: attempt 2 (loss-check): jump" in outcome.reason
    assert any("the recovery FAILED" in line for line in story(journal))
