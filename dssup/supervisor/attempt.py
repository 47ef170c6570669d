"""One attempt, start to verdict: build the command and environment, run torchrun, classify.

The command gets dssup's launcher options only where the user did not set them: a per-attempt
``--log-dir`` (each rank's ``error.json``, ``stdout.log``, ``stderr.log`` are kept),
``--redirects 3 --tee 3`` (files *and* console), and ``--max-restarts 0`` (torchrun would
relaunch the same failing config; dssup owns restarts). ``TORCHELASTIC_ERROR_FILE`` is set in
torchrun's own environment so it copies the root cause there.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dssup.supervisor.adapters import PlanAdapter
from dssup.supervisor.checkpoints import CheckpointRef
from dssup.supervisor.classify import classify
from dssup.supervisor.command import TorchrunCommand
from dssup.supervisor.contract import contract_env, rewrite_flags, write_plan_file
from dssup.supervisor.evidence import collect
from dssup.supervisor.fastfail import ErrorFileWatch
from dssup.supervisor.hygiene import oom_kill_count, wait_gpu_released
from dssup.supervisor.models import Failure, FailureKind, RankFailure, TrainingPlan
from dssup.supervisor.process import Child, kill_quietly, processes_with_token, terminate_token
from dssup.supervisor.report import AttemptReport

__all__ = ["AttemptResult", "AttemptSpec", "build_spec", "run_attempt"]

log = logging.getLogger(__name__)


@dataclass
class AttemptSpec:
    number: int
    dir: Path
    token: str
    argv: list[str]
    env: dict[str, str]  # the dssup-set part (contract + adapters), journalled
    resume_from: CheckpointRef | None
    notes: list[str]


@dataclass
class AttemptResult:
    exit_code: int
    failure: Failure | None
    started: float  # time.time()
    ended: float
    exited_mono: float  # monotonic time torchrun's exit was seen
    stragglers: list[int]
    oom_kills: int = 0
    spawned_at: float = 0.0  # time.time() right after torchrun was spawned
    exited_at: float = 0.0  # time.time() when its exit was seen
    report: AttemptReport | None = None  # the job-side report, read once the attempt ended


def _launcher_extras(cmd: TorchrunCommand, attempt_dir: Path) -> list[str]:
    extra: list[str] = []
    if not cmd.has("log-dir"):
        extra += ["--log-dir", str(attempt_dir / "logs")]
    if not cmd.has("redirects") and not cmd.has("tee"):
        extra += ["--redirects", "3", "--tee", "3"]
    if not cmd.has("max-restarts"):
        extra += ["--max-restarts", "0"]
    return extra


def build_spec(
    cmd: TorchrunCommand,
    plan: TrainingPlan,
    *,
    number: int,
    run_id: str,
    run_dir: Path,
    resume: CheckpointRef | None,
    checkpoint_dir: Path | None,
    adapters: Sequence[PlanAdapter],
) -> AttemptSpec:
    attempt_dir = run_dir / f"attempt-{number:03d}"
    attempt_dir.mkdir(parents=True, exist_ok=True)
    token = f"{run_id}/{number}"
    env = contract_env(
        plan,
        attempt=number,
        run_id=run_id,
        run_dir=run_dir,
        attempt_dir=attempt_dir,
        token=token,
        resume_from=resume.path if resume else None,
        checkpoint_dir=checkpoint_dir,
    )
    env["TORCHELASTIC_ERROR_FILE"] = str(attempt_dir / "root_cause.json")
    if "PYTHONUNBUFFERED" not in os.environ:
        # Output written before a failure must reach the logs even when fast-fail kills the
        # attempt: SIGKILL (and an unhandled SIGTERM) discard stdio buffers.
        env["PYTHONUNBUFFERED"] = "1"
    script_args = rewrite_flags(cmd.script_args, plan)
    notes: list[str] = []
    for adapter in adapters:
        applied = adapter.apply(plan, cmd, script_args, attempt_dir)
        script_args = applied.script_args if applied.script_args is not None else script_args
        env.update(applied.env)
        notes += applied.notes
    write_plan_file(attempt_dir / "plan.json", plan, number)
    argv = cmd.argv(_launcher_extras(cmd, attempt_dir), script_args)
    return AttemptSpec(number, attempt_dir, token, argv, env, resume, notes)


def run_attempt(
    spec: AttemptSpec,
    cmd: TorchrunCommand,
    *,
    world_size: int,
    grace_s: float,
    gpu_timeout_s: float,
    sink: Callable[[str], None] | None,
    stop_signal: Callable[[], int | None],
    on_start: Callable[[Child], None],
    fast_fail: bool = True,
) -> AttemptResult:
    """Launch torchrun, wait (forwarding a stop request), clean up, and classify the end."""
    oom_before = oom_kill_count()
    log_dir = Path(user_log) if (user_log := cmd.option("log-dir")) else spec.dir / "logs"
    child = Child(spec.argv, {**os.environ, **spec.env}, spec.dir / "torchrun.log", sink)
    started = time.time()
    child.start()
    spawned_at = time.time()
    on_start(child)
    watch = ErrorFileWatch(log_dir, started - 1.0) if fast_fail else None
    forwarded: int | None = None
    stopped: RankFailure | None = None
    code = None
    while code is None:
        code = child.wait(0.05)
        if code is None and (sig := stop_signal()) is not None and forwarded is None:
            log.warning("forwarding %s to torchrun (pid %s)", signal.Signals(sig).name, child.pid)
            child.send(sig)
            forwarded = sig
        if code is None and watch is not None and stopped is None and forwarded is None:
            stopped = watch.poll()
            if stopped is not None:
                log.warning("rank %s: %s: stopping the attempt now", stopped.rank, stopped.kind)
                for pid in processes_with_token(spec.token):
                    kill_quietly(pid, signal.SIGKILL)
    exited, exited_at = time.monotonic(), time.time()
    pids = processes_with_token(spec.token)
    stragglers = terminate_token(spec.token, grace_s) if pids else []
    wait_gpu_released(pids, gpu_timeout_s)
    oom_kills = oom_kill_count() - oom_before
    evidence = collect(
        spec.dir,
        code,
        child.console_tail(),
        log_dir=log_dir,
        oom_kills=oom_kills,
        world_size=world_size,
    )
    failure = classify(evidence)
    if stopped is not None and failure is not None:
        note = f"dssup stopped the attempt (SIGKILL) on rank {stopped.rank}'s error file"
        failure = failure.model_copy(update={"evidence": (*failure.evidence, note)})
        code = 1  # what torchrun reports for a failed worker; the kill was ours
    if forwarded is not None:
        failure = Failure(
            kind=FailureKind.INTERRUPTED,
            exit_code=code,
            signal=forwarded,
            message=f"dssup received {signal.Signals(forwarded).name}",
            evidence=(f"forwarded {signal.Signals(forwarded).name} to torchrun",),
        )
    return AttemptResult(
        code, failure, started, time.time(), exited, stragglers, oom_kills, spawned_at, exited_at
    )
