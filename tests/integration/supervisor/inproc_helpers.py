"""Running ``dssup run`` around guarded jobs: the memory-cap environment, the reference run,
and the weights' distance. ``dssup run`` itself goes through ``sup_helpers.dssup_run``
(``tests/procs.run_reaped``): on a timeout, or when the test is stopped, it and every worker
of every attempt are killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from sup_helpers import ROOT, dssup_run, journal, of

from tests.memprobe import MALLOC  # the capped workers' glibc settings

EXAMPLE = ROOT / "examples" / "train_guarded.py"


def run_dssup(run_dir: Path, *args: str, timeout: float = 240) -> tuple[int, str, list[dict]]:
    """``dssup run --run-dir RUN_DIR ARGS``: (exit status, output, journal)."""
    res = dssup_run(run_dir, *args, timeout=timeout, env=MALLOC)
    return res.returncode, res.stdout + res.stderr, journal(run_dir)


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
