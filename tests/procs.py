"""Run a process tree (``dssup run``, torchrun, accelerate) in a test and never leave it behind.

``subprocess.run(..., timeout=...)`` kills only the child it started: a ``dssup run`` killed that
way leaves torchrun and its workers running (the supervisor starts torchrun in a session of its
own, and torchrun starts its workers in theirs), eating the CI machine's two cores. Here the
command runs in a new session; on a timeout it is asked to stop (SIGTERM: dssup and torchrun
stop their workers), then its session is SIGKILLed, then every process still carrying one of
its run tokens (``DSSUP_RUN_TOKEN``, set on every attempt's processes) is killed, and the test
fails with the tail of the output.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["dssup_cli", "processes_with_token_prefix", "reap", "reap_tokens", "run_reaped"]


def processes_with_token_prefix(prefix: str) -> list[int]:
    """Live processes whose ``DSSUP_RUN_TOKEN`` starts with ``prefix``."""
    needle = f"DSSUP_RUN_TOKEN={prefix}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if needle in environ and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def _run_ids(run_dir: Path | None) -> list[str]:
    """Run ids of the journal in ``run_dir`` (the prefix of every attempt's token)."""
    journal = run_dir / "journal.jsonl" if run_dir else None
    if journal is None or not journal.exists():
        return []
    ids = set()
    for line in journal.read_text().splitlines():
        with contextlib.suppress(ValueError):
            if run_id := json.loads(line).get("run_id"):
                ids.add(str(run_id))
    return sorted(ids)


def _signal(proc: subprocess.Popen[Any], sig: int) -> None:
    """``sig`` to ``proc``'s session (started with ``start_new_session=True``), else to it."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def reap_tokens(run_dirs: Iterable[Path]) -> list[int]:
    """SIGKILL every live process of the runs journalled in ``run_dirs``; returns their pids."""
    ids = [run_id for run_dir in run_dirs for run_id in _run_ids(run_dir)]
    killed = [pid for run_id in ids for pid in processes_with_token_prefix(f"{run_id}/")]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(processes_with_token_prefix(f"{r}/") for r in ids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return killed


def reap(proc: subprocess.Popen[Any], run_dir: Path | None = None, grace: float = 30.0) -> None:
    """Stop ``proc`` and everything it started: SIGTERM (dssup and torchrun stop their
    workers), SIGKILL after ``grace``, then whatever still carries the run's tokens."""
    if proc.poll() is None:
        _signal(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    _signal(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    reap_tokens([run_dir] if run_dir else [])


def run_reaped(
    cmd: Sequence[str], timeout: float, run_dir: Path | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True)`` that, on a timeout, stops the
    whole tree it started (see the module docstring) and fails the test."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        reap(proc, run_dir)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[0]} timed out after {timeout:.0f} s:\n{out[-2000:]}\n{err[-2000:]}")
    except BaseException:  # KeyboardInterrupt, pytest-timeout: still leave nothing behind
        reap(proc, run_dir, grace=10)
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def dssup_cli(*args: str, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``python -m dssup ARGS`` as a user runs it (output captured as text), reaped on a timeout."""
    return run_reaped([sys.executable, "-m", "dssup", *args], timeout, **kwargs)
