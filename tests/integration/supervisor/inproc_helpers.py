"""Running ``dssup run`` around guarded jobs with a hard timeout that kills what it started.

``subprocess.run(timeout=...)`` kills only dssup itself; torchrun follows it (parent-death
signal) but its workers run in their own sessions. ``run_dssup`` starts dssup in a new session
and, when the time is up or the test fails, kills that session and every process whose
environment names the run directory (every worker of every attempt carries ``DSSUP_RUN_DIR``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from sup_helpers import DSSUP, ROOT, journal, of

EXAMPLE = ROOT / "examples" / "train_guarded.py"
# glibc: map blocks over 128 KiB, one arena (a thread's arena would reserve 64 MiB of the cap).
MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}


def _run_dir_processes(run_dir: Path) -> list[int]:
    needle = f"DSSUP_RUN_DIR={run_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(int(entry))
    return found


def kill_everything(proc: subprocess.Popen[str], run_dir: Path) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in _run_dir_processes(run_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(10)


def run_dssup(run_dir: Path, *args: str, timeout: float = 240) -> tuple[int, str, list[dict]]:
    """``dssup run --run-dir RUN_DIR ARGS``: (exit status, output, journal)."""
    cmd = [DSSUP, "run", "--run-dir", str(run_dir), "--backoff", "0.2", *args]
    proc = subprocess.Popen(
        cmd, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **MALLOC}, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_everything(proc, run_dir)
        raise
    except BaseException:
        kill_everything(proc, run_dir)
        raise
    finally:
        if _run_dir_processes(run_dir):
            kill_everything(proc, run_dir)
    return proc.returncode, out, journal(run_dir)


def reference(out: Path, *job: str) -> dict[str, torch.Tensor]:
    """The weights a run that never failed ends with (one process, the whole global batch)."""
    subprocess.run(
        [sys.executable, str(EXAMPLE), *job, "--reference", str(out)],
        check=True, timeout=120, env={**os.environ, **MALLOC}, capture_output=True,
    )  # fmt: skip
    return torch.load(out)


def relative_l2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    diff = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in a) ** 0.5
    return diff / sum(float((b[k].double() ** 2).sum()) for k in a) ** 0.5


def attempts(records: list[dict]) -> list[dict]:
    return of(records, "attempt-started")
