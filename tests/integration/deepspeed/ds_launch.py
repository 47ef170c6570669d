"""Shared helpers for the DeepSpeed integration tests: launch real torchrun jobs on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from tests.memprobe import HEAP  # glibc's heap pinned, whatever the caller sets
from tests.procs import run_reaped

ROOT = Path(__file__).resolve().parents[3]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
DSSUP = str(Path(sys.executable).with_name("dssup"))
EXAMPLE = ROOT / "examples" / "deepspeed" / "train_ds.py"
HAVE_DEEPSPEED = find_spec("deepspeed") is not None and find_spec("torch") is not None
needs_deepspeed = pytest.mark.skipif(
    not HAVE_DEEPSPEED,
    reason="the deepspeed extra is not installed (pip install -e '.[deepspeed]')",
)


def ds_env(**extra: str) -> dict[str, str]:
    """CPU DeepSpeed, one thread per rank (deterministic GEMMs whatever the rank count)."""
    env = dict(os.environ)
    env |= {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env |= extra
    return env


def torchrun(
    nproc: int, script: Path, *args: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), str(script), *args]
    return run_reaped(cmd, timeout, cwd=ROOT, env=ds_env(**env))


def dssup_run_example(
    work: Path,
    config: dict[str, Any],
    dssup_args: list[str],
    example_args: list[str],
    *,
    timeout: float,
    **env: str,
) -> dict[str, Any]:
    """Real ``dssup run --device cpu`` around real torchrun with 2 ranks of the DeepSpeed example
    reading ``config``; run directory and checkpoints under ``work``. glibc maps every block over
    128 KiB (``MALLOC_MMAP_THRESHOLD_``), so an address-space cap tracks live tensors. Returns the
    completed process, the journal records, the attempt directories and the config's path."""
    cfg = work / "ds.json"
    cfg.write_text(json.dumps(config))
    run_env = dict(os.environ) | {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    run_env |= HEAP
    run_env |= env
    run_env["PYTHONPATH"] = str(ROOT)
    cmd = [
        DSSUP, "run", "--run-dir", str(work / "run"), "--device", "cpu",
        "--checkpoint-dir", str(work / "ckpt"), *dssup_args, "--",
        "torchrun", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
        "--deepspeed_config", str(cfg), "--save-dir", str(work / "ckpt"), *example_args,
    ]  # fmt: skip
    done = run_reaped(cmd, timeout, work / "run", cwd=work, env=run_env)
    journal = [json.loads(x) for x in (work / "run" / "journal.jsonl").read_text().splitlines()]
    attempts = sorted((work / "run").glob("attempt-*"))
    return {"done": done, "journal": journal, "attempts": attempts, "cfg": cfg, "work": work}


def journal_of(journal: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The journal records of one type (``attempt-ended``, ``remedy``, ...)."""
    return [r for r in journal if r["type"] == kind]


def ds_events(attempt: Path, event: str) -> list[dict[str, Any]]:
    """The example job's ``DSSUP_DS {json}`` lines of one event in an attempt's console log."""
    out = []
    for line in (attempt / "torchrun.log").read_text().splitlines():
        if "DSSUP_DS " in line:
            doc = json.loads(line.split("DSSUP_DS ", 1)[1])
            if doc["event"] == event:
                out.append(doc)
    return out
