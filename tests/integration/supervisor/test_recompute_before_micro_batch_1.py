"""An OOM before the first checkpoint reaches recompute before micro-batch 1 (real torchrun).

``examples/train_tiny.py`` (4 layers, 1024-token sequences from step 0, every rank capped)
fails in torch's own ``DefaultCPUAllocator`` at micro-batch 4 and at micro-batch 2 without
recompute, in step 0, before its first checkpoint (step 2), and fits at micro-batch 2 with
recompute. The cap is not a number of MiB measured once by hand: it sits between what one step
at micro-batch 2 needs without and with recompute, both measured on the machine the test runs
on (``tests/memprobe.py``; about 57 and 18 MiB on a 2-core VM, the cap about 32). At
1024 tokens every activation is far above glibc's 128 KiB mmap threshold, so the address space
follows the tensors rather than the heap's fragmentation (at 384 tokens micro-batch 1's
activations are 96 KiB heap blocks, and the need moved with the allocator's history). Every
failure restarts from step 0, so the ladder must not spend attempts walking down to
micro-batch 1: after 4 -> 2 it raises recompute, and the run then finishes with the weights of
a run that never failed.
"""

import json
import subprocess
import sys

import pytest
from sup_helpers import EXAMPLE, WORKERS, dssup_run, journal, of

from tests.memprobe import cap_between, probe

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]
COMPARE = str(EXAMPLE.parent / "compare_weights.py")
JOB = ["--global-batch-size", "8", "--steps", "2", "--checkpoint-every", "2",
       "--long-from-step", "0", "--long-seq-len", "1024", "--layers", "4"]  # fmt: skip


def _cap_mib() -> int:
    need = probe(str(WORKERS / "probe_tiny.py"), "--layers", "4", "--seq-len", "1024",
                 "2:2:none", "2:2:selective")  # fmt: skip
    return cap_between(need["2:2:none"], need["2:2:selective"], "micro-batch 2 at length 1024")


def test_an_oom_before_the_first_checkpoint_tries_recompute_before_micro_batch_1(tmp_path):
    run, ckpt, out = tmp_path / "run", tmp_path / "ckpt", tmp_path / "recovered.pt"
    cap = _cap_mib()
    res = dssup_run(
        run, "--global-batch-size", "8", "--checkpoint-dir", str(ckpt), "--",
        "torchrun", "--standalone", "--nproc-per-node", "2", str(EXAMPLE), *JOB,
        "--micro-batch-size", "4", "--memory-cap-mib", str(cap), "--out", str(out),
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
