"""Running the real ``dssup run`` CLI around real torchrun jobs, and reading what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WORKERS = ROOT / "tests" / "fixtures" / "supervisor" / "workers"
EXAMPLE = ROOT / "examples" / "train_tiny.py"
DSSUP = str(Path(sys.executable).parent / "dssup")


def torchrun(*script: str) -> list[str]:
    return ["--", "torchrun", "--standalone", "--nproc-per-node", "2", *script]


def dssup_run(
    run_dir: Path,
    *args: str,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    cmd = [DSSUP, "run", "--run-dir", str(run_dir), "--backoff", "0.2", *args]
    return subprocess.run(
        cmd,
        check=False,
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def journal(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "journal.jsonl").read_text().splitlines()]


def of(records: list[dict], type_: str) -> list[dict]:
    return [r for r in records if r["type"] == type_]


def token_processes(prefix: str) -> list[int]:
    """Live processes whose DSSUP_RUN_TOKEN starts with ``prefix`` (orphan check)."""
    needle = f"DSSUP_RUN_TOKEN={prefix}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if needle in env and state != b"Z":
            found.append(int(entry))
    return found


def memory_cgroup() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrl, path = line.split(":", 2)
        if "memory" in ctrl.split(","):
            p = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return p if os.access(p, os.W_OK) else None
    return None
