"""Acceptance: ``dssup run`` recovers the example training job from a real allocator OOM.

Real torchrun, two gloo ranks, a real ``DefaultCPUAllocator`` failure under an address-space
cap at micro-batch 16: rank 1's "device" is what micro-batch 16 holds when the logits of step 4
exist, plus 1 MiB (``--memory-cap-at forward``, the same on any machine), and the next attempt
caps at the budget found (``--memory-cap-file``). dssup must detect it on the failing rank,
relaunch at micro-batch 8
with twice the accumulation from the step-4 checkpoint, finish, and end with the weights of
runs that never failed (same global batch, same data order): a torchrun run without a cap and
a single-process run, both within 1e-5 relative.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import run_reaped

pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_tiny.py")
COMPARE = str(ROOT / "examples" / "compare_weights.py")
BIN = Path(sys.executable).parent


def _compare(a: Path, b: Path) -> dict:
    out = subprocess.run(
        [sys.executable, COMPARE, str(a), str(b)], capture_output=True, text=True, check=False
    )
    return json.loads(out.stdout)


def test_recovers_from_a_real_oom_with_the_global_batch_exact(tmp_path):
    run = tmp_path / "run"
    res = run_reaped(
        [
            str(BIN / "dssup"),
            "run",
            "--run-dir",
            str(run),
            "--global-batch-size",
            "32",
            "--micro-batch-size",
            "16",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--",
            "torchrun",
            "--standalone",
            "--nproc-per-node",
            "2",
            EXAMPLE,
            "--memory-cap-at",
            "forward",
            "--memory-cap-file",
            str(tmp_path / "cap-{rank}.json"),
            "--memory-cap-ranks",
            "1",
            "--out",
            str(tmp_path / "recovered.pt"),
        ],
        600,
        run,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rec = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]
    starts = [r for r in rec if r["type"] == "attempt-started"]
    ends = [r for r in rec if r["type"] == "attempt-ended"]
    oom = ends[0]["failure"]
    assert oom["kind"] == "host-oom" and oom["rank"] == 1 and oom["signature"] == "cpu-allocator"
    assert "DefaultCPUAllocator: can't allocate memory" in oom["message"]
    assert ends[0]["checkpoint_step"] == 4 and ends[1]["failure"] is None
    assert [(s["plan"]["micro_batch"], s["plan"]["grad_accum"]) for s in starts] == [
        (16, 1),
        (8, 2),
    ]
    assert {s["plan"]["global_batch"] for s in starts} == {32}
    assert starts[1]["resume_step"] == 4 and starts[1]["env"]["DSSUP_MICRO_BATCH_SIZE"] == "8"
    assert "dssup: succeeded after 2 attempt(s)" in res.stdout
    assert "global batch 32 (verified by the job in every attempt)" in res.stdout
    reports = [r for r in rec if r["type"] == "job-report"]
    assert [r["batch"]["status"] for r in reports] == ["verified", "verified"]
    assert [r["first_step"] for r in reports] == [0, 4]  # attempt 2 really resumed at step 4
    assert reports[1]["completed_ranks"] == [0, 1]
    budget = json.loads((tmp_path / "cap-1.json").read_text())["budget_bytes"]
    assert budget > 16 << 20, "the device holds micro-batch 16's activations up to its logits"
    assert not (tmp_path / "cap-0.json").exists(), "rank 0 ran uncapped"

    never = run_reaped(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            EXAMPLE,
            "--micro-batch-size",
            "16",
            "--out",
            str(tmp_path / "never_failed.pt"),
        ],
        600,
        cwd=tmp_path,
    )
    assert never.returncode == 0, never.stderr[-3000:]
    subprocess.run(
        [sys.executable, EXAMPLE, "--reference", str(tmp_path / "single.pt")],
        check=True,
        capture_output=True,
        timeout=600,
    )
    for ref in ("never_failed.pt", "single.pt"):
        cmp = _compare(tmp_path / "recovered.pt", tmp_path / ref)
        assert cmp["within_rtol"], (ref, cmp)
