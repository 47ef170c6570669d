"""An OOM before the first checkpoint reaches recompute before micro-batch 1 (real torchrun).

``examples/train_tiny.py`` (4 layers, 384-token sequences from step 0, every rank's address
space capped 16 MiB above its start-up size: the CPU notes' recipe) fails in torch's own
``DefaultCPUAllocator`` at micro-batch 4 and at micro-batch 2 without recompute, in step 0,
before its first checkpoint (step 2). Measured by hand on this machine with plain torchrun: at
this cap micro-batch 1 without recompute fails too (it passes from a 20 MiB cap), and
micro-batch 2 with recompute passes (from a 12 MiB cap). Every failure restarts from step 0,
so the ladder must not spend attempts walking down to micro-batch 1: after 4 -> 2 it raises
recompute, and the run then finishes with the weights of a run that never failed.
"""

import json
import subprocess
import sys

import pytest
from sup_helpers import EXAMPLE, dssup_run, journal, of

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]
COMPARE = str(EXAMPLE.parent / "compare_weights.py")
JOB = ["--global-batch-size", "8", "--steps", "2", "--checkpoint-every", "2",
       "--long-from-step", "0", "--layers", "4"]  # fmt: skip


def test_an_oom_before_the_first_checkpoint_tries_recompute_before_micro_batch_1(tmp_path):
    run, ckpt, out = tmp_path / "run", tmp_path / "ckpt", tmp_path / "recovered.pt"
    res = dssup_run(
        run, "--global-batch-size", "8", "--checkpoint-dir", str(ckpt), "--",
        "torchrun", "--standalone", "--nproc-per-node", "2", str(EXAMPLE), *JOB,
        "--micro-batch-size", "4", "--memory-cap-mib", "16", "--out", str(out),
        timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    rec = journal(run)
    starts, ends = of(rec, "attempt-started"), of(rec, "attempt-ended")
    decisions = of(rec, "decision")
    plans = [(s["plan"]["micro_batch"], s["plan"]["grad_accum"], s["plan"]["recompute"])
             for s in starts]  # fmt: skip
    assert plans == [(4, 1, "none"), (2, 2, "none"), (2, 2, "selective")]
    for ended in ends[:2]:  # real allocator failures, in step 0, no checkpoint yet
        failure = ended["failure"]
        assert failure["kind"] == "host-oom" and failure["signature"] == "cpu-allocator"
        assert "DefaultCPUAllocator: can't allocate memory" in failure["message"]
        assert ended["checkpoint_step"] is None
    assert [s["resume_step"] for s in starts] == [None, None, None]
    assert ends[2]["failure"] is None and ends[2]["checkpoint_step"] == 2
    assert [(d["action"], d["step"]) for d in decisions] == [
        ("remedy", "halve-micro-batch"),
        ("remedy", "recompute"),
    ]
    assert decisions[1]["reason"] == "recompute none -> selective: activations are recomputed"
    assert decisions[1]["changes"] == {"recompute": ["none", "selective"]}
    # the job itself says it trained with recompute at micro-batch 2 and global batch 8
    reports = of(rec, "job-report")
    assert [r["batch"]["status"] for r in reports] == ["verified"] * 3
    started = [x for x in reports[2]["records"] if x["type"] == "started"]
    assert {(x["micro_batch"], x["grad_accum"], x["recompute"]) for x in started} == {
        (2, 2, "selective")
    }
    assert "global batch 8 (verified by the job in every attempt)" in res.stdout

    reference = tmp_path / "never_failed.pt"
    subprocess.run(
        [sys.executable, str(EXAMPLE), *JOB, "--micro-batch-size", "4", "--reference",
         str(reference)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    cmp = subprocess.run([sys.executable, COMPARE, str(out), str(reference)],
                         capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert json.loads(cmp.stdout)["relative_l2"] < 1e-5, cmp.stdout
