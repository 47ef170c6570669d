"""Running the real ``dssup run`` CLI around real torchrun jobs, and reading what it wrote.

``token_processes`` (re-exported) finds the live processes of a run's attempts (orphan check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.procs import processes_with_token_prefix, run_reaped

ROOT = Path(__file__).resolve().parents[3]
WORKERS = ROOT / "tests" / "fixtures" / "supervisor" / "workers"
EXAMPLE = ROOT / "examples" / "train_tiny.py"
DSSUP = str(Path(sys.executable).parent / "dssup")
token_processes = processes_with_token_prefix


def torchrun(*script: str) -> list[str]:
    return ["--", "torchrun", "--standalone", "--nproc-per-node", "2", *script]


def dssup_run(
    run_dir: Path,
    *args: str,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``dssup run`` to its end; on a timeout, it and every worker it started are stopped."""
    cmd = [DSSUP, "run", "--run-dir", str(run_dir), "--backoff", "0.2", *args]
    return run_reaped(cmd, timeout, run_dir, cwd=run_dir.parent, env={**os.environ, **(env or {})})


def journal(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "journal.jsonl").read_text().splitlines()]


def of(records: list[dict], type_: str) -> list[dict]:
    return [r for r in records if r["type"] == type_]


def memory_cgroup() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrl, path = line.split(":", 2)
        if "memory" in ctrl.split(","):
            p = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return p if os.access(p, os.W_OK) else None
    return None
