"""The supervisor itself dies or is told to stop: the run continues (SIGKILL) or ends cleanly
(SIGTERM), the journal neither loses nor repeats an attempt, and no worker is left behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sup_helpers import DSSUP, WORKERS, journal, of, token_processes

from dssup.supervisor.journal import Journal
from dssup.supervisor.models import TrainingPlan
from tests.procs import reap, run_reaped

pytestmark = [pytest.mark.integration]


def _cmd(run_dir: Path, ckpt: Path) -> list[str]:
    return [
        DSSUP,
        "run",
        "--run-dir",
        str(run_dir),
        "--checkpoint-dir",
        str(ckpt),
        "--quiet",
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKERS / "sleeper.py"),
    ]


def _wait_for_step(ckpt: Path, step: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [
            int(p.name.split("_")[1]) for p in ckpt.glob("step_*") if (p / ".metadata").exists()
        ]
        if done and max(done) >= step:
            return
        assert proc.poll() is None, "dssup ended early"
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint {step} within {timeout} s")


def _wait_no_processes(prefix: str, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := token_processes(prefix)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


@pytest.mark.torch
@pytest.mark.slow
def test_sigkill_then_rerun_continues_the_same_run(tmp_path):
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    env = {**os.environ, "SLEEPER_STEPS": "24"}
    first = subprocess.Popen(
        _cmd(run_dir, ckpt),
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_step(ckpt, 3, first)
    except BaseException:
        reap(first, run_dir)
        raise
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    run_id = journal(run_dir)[0]["run_id"]
    assert run_id.startswith("run-") and len(run_id) == len("run-") + 8
    assert _wait_no_processes(f"{run_id}/1") == [], "workers of the killed supervisor survived"
    second = run_reaped(_cmd(run_dir, ckpt), 300, run_dir, cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    rec = journal(run_dir)
    assert [r["seq"] for r in rec] == list(range(len(rec)))
    assert [r["attempt"] for r in of(rec, "attempt-started")] == [1, 2]
    assert [r["attempt"] for r in of(rec, "attempt-ended")] == [1, 2]
    lost = of(rec, "attempt-ended")[0]["failure"]
    assert lost["kind"] == "interrupted" and "supervisor was killed" in lost["message"]
    assert of(rec, "supervisor-restarted")[0]["lost_attempt"] == 1
    assert of(rec, "attempt-started")[1]["resume_step"] >= 3
    assert len(of(rec, "run-started")) == 1 and of(rec, "run-ended")[0]["outcome"] == "succeeded"
    assert token_processes(f"{run_id}/") == []


@pytest.mark.torch
@pytest.mark.slow
def test_sigterm_is_forwarded_and_nothing_survives(tmp_path):
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    proc = subprocess.Popen(
        _cmd(run_dir, ckpt),
        cwd=tmp_path,
        start_new_session=True,
        env={**os.environ, "SLEEPER_STEPS": "200"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_step(ckpt, 1, proc)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        reap(proc, run_dir)
    rec = journal(run_dir)
    run_id = rec[0]["run_id"]
    assert of(rec, "run-ended")[0]["outcome"] == "interrupted"
    assert len(of(rec, "attempt-started")) == 1
    assert token_processes(f"{run_id}/") == []


def test_restart_kills_orphans_of_the_lost_attempt(tmp_path):
    """No torchrun needed: a process carrying the lost attempt's token stands in for a worker
    whose torchrun did not take it down (e.g. the supervisor's host was frozen, not killed)."""
    from dssup.supervisor import RemedyPlanner, Supervisor, SupervisorConfig, parse_command

    run_id = f"orphan-{os.getpid()}-{tmp_path.name}"
    plan = TrainingPlan(micro_batch=1, grad_accum=1, global_batch=2, dp=2, world_size=2)
    j = Journal(tmp_path)
    j.append(
        "run-started",
        run_id=run_id,
        command=["torchrun", "x.py"],
        plan=plan.model_dump(mode="json"),
        config={},
    )
    j.append("attempt-started", attempt=1, token=f"{run_id}/1", plan=plan.model_dump(mode="json"))
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, "DSSUP_RUN_TOKEN": f"{run_id}/1"},
    )
    try:
        assert token_processes(f"{run_id}/1") == [orphan.pid]
        config = SupervisorConfig(
            run_id=run_id,
            run_dir=tmp_path,
            command=["torchrun", "x.py"],
            initial_plan=plan,
            grace_s=2,
        )
        sup = Supervisor(config, parse_command(["torchrun", "x.py"]), RemedyPlanner.default())
        sup._recover(Journal(tmp_path))
        assert orphan.wait(timeout=10) == -signal.SIGTERM
    finally:
        orphan.kill()
    rec = Journal(tmp_path).records
    assert rec[-2]["type"] == "attempt-ended" and rec[-2]["stragglers"] == [orphan.pid]
    assert rec[-1]["type"] == "supervisor-restarted"
