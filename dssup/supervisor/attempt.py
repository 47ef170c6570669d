"""One attempt, start to verdict: build the command and environment, launch, watch, classify.

The command gets dssup's launcher options only where the user did not set them (the
launcher module decides: for torchrun a per-attempt ``--log-dir`` keeping each rank's
``error.json``, ``stdout.log`` and ``stderr.log``, ``--redirects 3 --tee 3`` for files *and*
console, and ``--max-restarts 0``: dssup owns restarts). ``TORCHELASTIC_ERROR_FILE`` is set in
the launcher's environment so torchrun copies the root cause there. While the attempt runs,
dssup watches each rank's error file and output (fast fail, with or without ``@record``) and
the job-side report (a global-batch mismatch stops it too); the launcher's own traceback is
folded to one line on the console.
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
from dssup.supervisor.command import LaunchCommand
from dssup.supervisor.consolefold import LauncherTracebackFold
from dssup.supervisor.contract import contract_env, rewrite_flags, write_plan_file
from dssup.supervisor.evidence import collect
from dssup.supervisor.fastfail import ErrorFileWatch
from dssup.supervisor.hygiene import oom_kill_count, wait_gpu_released
from dssup.supervisor.jobview import JobView
from dssup.supervisor.launchers.base import RankLog, RankLogSource
from dssup.supervisor.livewatch import OutputWatch, ReportWatch
from dssup.supervisor.models import Failure, FailureKind, RankFailure, TrainingPlan
from dssup.supervisor.process import Child, kill_quietly, processes_with_token, terminate_token
from dssup.supervisor.report import AttemptReport, BatchCheck, report_path

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


def build_spec(
    cmd: LaunchCommand,
    plan: TrainingPlan,
    *,
    number: int,
    run_id: str,
    run_dir: Path,
    resume: CheckpointRef | None,
    checkpoint_dir: Path | None,
    adapters: Sequence[PlanAdapter],
    view: JobView | None = None,
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
    if view is not None:
        script_args, extra_env = view.render(plan, cmd.script_args, resume)
        env.update(extra_env)
    else:
        script_args = rewrite_flags(cmd.script_args, plan)
    notes: list[str] = []
    for adapter in adapters:
        applied = adapter.apply(plan, cmd, script_args, attempt_dir)
        script_args = applied.script_args if applied.script_args is not None else script_args
        env.update(applied.env)
        notes += applied.notes
    write_plan_file(attempt_dir / "plan.json", plan, number)
    argv = cmd.argv(cmd.launcher.extras(cmd, attempt_dir), script_args)
    return AttemptSpec(number, attempt_dir, token, argv, env, resume, notes)


class _ConsoleLog:
    """A launcher without per-rank files (accelerate's single process): its console output is
    the one rank's output."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rank_logs(self, log_dir: Path) -> dict[int, RankLog]:
        return {0: RankLog(0, 0, self.path, None)}


@dataclass
class _Watches:
    """What dssup watches while an attempt runs (see ``livewatch``)."""

    errors: ErrorFileWatch | None
    output: OutputWatch | None
    report: ReportWatch
    stopped: RankFailure | None = None
    mismatch: BatchCheck | None = None

    def poll(self, fast_fail: bool, running: bool) -> bool:
        """True the first time something says the running attempt must stop now."""
        live = self.output.poll() if self.output is not None else None
        if not running or self.stopped is not None or self.mismatch is not None:
            return False
        if fast_fail:
            self.stopped = (self.errors.poll() if self.errors is not None else None) or live
        self.mismatch = self.report.poll()
        return self.stopped is not None or self.mismatch is not None


def _verdict(
    failure: Failure | None, code: int, w: _Watches, forwarded: int | None
) -> tuple[Failure | None, int]:
    """The classified failure, amended with why dssup itself stopped the attempt."""
    if w.stopped is not None and failure is not None:
        how = "error file" if "error-file" in w.stopped.sources else "traceback on stderr"
        note = f"dssup stopped the attempt (SIGKILL) on rank {w.stopped.rank}'s {how}"
        failure = failure.model_copy(update={"evidence": (*failure.evidence, note)})
        code = 1  # what the launcher reports for a failed worker; the kill was ours
    if w.mismatch is not None:
        failure = Failure(
            kind=FailureKind.BATCH_MISMATCH,
            exit_code=code,
            message=w.mismatch.detail,
            evidence=("dssup stopped the attempt (SIGKILL) on the job's own report",),
        )
        code = 1
    if forwarded is not None:
        name = signal.Signals(forwarded).name
        failure = Failure(
            kind=FailureKind.INTERRUPTED,
            exit_code=code,
            signal=forwarded,
            message=f"dssup received {name}",
            evidence=(f"forwarded {name} to the launcher",),
        )
    return failure, code


def run_attempt(
    spec: AttemptSpec,
    cmd: LaunchCommand,
    *,
    world_size: int,
    grace_s: float,
    gpu_timeout_s: float,
    sink: Callable[[str], None] | None,
    stop_signal: Callable[[], int | None],
    on_start: Callable[[Child], None],
    fast_fail: bool = True,
    expected_global_batch: int | None = None,
) -> AttemptResult:
    """Launch, watch (forwarding a stop request), clean up, and classify the end."""
    oom_before = oom_kill_count()
    launcher = cmd.launcher
    log_dir = launcher.log_dir(cmd, spec.dir)
    console_path = spec.dir / "torchrun.log"
    fold = LauncherTracebackFold(sink, console_path) if sink is not None else None
    child = Child(spec.argv, {**os.environ, **spec.env}, console_path, fold)
    started = time.time()
    child.start()
    spawned_at = time.time()
    on_start(child)
    ranks: RankLogSource = launcher if log_dir is not None else _ConsoleLog(console_path)
    where = log_dir if log_dir is not None else spec.dir
    echo = sink if launcher.echo_rank_logs else None
    w = _Watches(
        ErrorFileWatch(where, started - 1.0, launcher=ranks) if fast_fail else None,
        OutputWatch(where, ranks, echo=echo) if fast_fail or echo else None,
        ReportWatch(report_path(spec.dir), expected_global_batch),
    )
    forwarded: int | None = None
    code = None
    while code is None:
        code = child.wait(0.05)
        if code is None and (sig := stop_signal()) is not None and forwarded is None:
            log.warning(
                "forwarding %s to the launcher (pid %s)", signal.Signals(sig).name, child.pid
            )
            child.send(sig)
            forwarded = sig
        if w.poll(fast_fail, running=code is None and forwarded is None):
            what = f"rank {w.stopped.rank}: {w.stopped.kind}" if w.stopped else "batch mismatch"
            log.warning("%s: stopping the attempt now", what)
            for pid in processes_with_token(spec.token):
                kill_quietly(pid, signal.SIGKILL)
    if w.output is not None:
        w.output.poll(force=True)
    if fold is not None:
        fold.flush()
    exited, exited_at = time.monotonic(), time.time()
    pids = processes_with_token(spec.token)
    stragglers = terminate_token(spec.token, grace_s) if pids else []
    wait_gpu_released(pids, gpu_timeout_s)
    oom_kills = oom_kill_count() - oom_before
    evidence = collect(spec.dir, code, child.console_tail(), log_dir=where, oom_kills=oom_kills,
                       world_size=world_size, launcher=ranks)  # fmt: skip
    failure, code = _verdict(classify(evidence), code, w, forwarded)
    return AttemptResult(
        code, failure, started, time.time(), exited, stragglers, oom_kills, spawned_at, exited_at
    )
