"""Acceptance for in-process OOM recovery (``dssup.runtime.StepGuard``), through the real
``dssup run`` around real torchrun with two gloo ranks and real allocator failures.

The job is ``examples/train_guarded.py``: train_tiny's transformer and data, each optimizer
step under the guard. Rank 1 alone runs under a memory cap; the sequence length grows from 32
to 384 at step 4, which is where it runs out of memory. Where the OOM lands is not left to a
number of MiB (another machine's kernels and allocator move a job's need by a few MiB, and an
OOM placed that close to a need lands elsewhere): ``--memory-cap-at forward`` makes rank 1's
"device" exactly as large as what its first micro-batch of step 4 holds when its logits exist,
plus 1 MiB, so that micro-batch's cross-entropy fails in the forward; ``--memory-cap-at
backward`` caps when its backward starts, so the gradient of the logits fails in the backward
(``dssup.runtime.standin``). A micro-batch half as big holds about half as much, so the redone
step fits the same device. The OOM at micro-batch 1 uses length 1024 and 8 layers and a cap
between what micro-batch 1 needs without and with activation recompute, both measured on the
machine the test runs on (``tests/memprobe.py``): every split fails in-process, and only
recompute, which the supervisor adds after the guard gave up, fits.

The takeover times are bounded by what a wrong path would wait, not by one machine's speed:
the guard's watchdog is 60 s and ``--grace`` 30 s, and where the restart is a remedy (the OOM
at micro-batch 1) ``--backoff`` is 30 s too, so a guard that waited for its watchdog, a
supervisor that waited out its grace, or one that took a remedy for a transient failure would
take 30 s or more; the bound is 10 s (measured 0.3-0.5 s on an idle 2-core VM). A rank killed
outright is a transient failure: its restart comes after the helper's 0.2 s backoff.
"""

from __future__ import annotations

import json

import pytest
import torch
from inproc_helpers import EXAMPLE, attempts, reference, relative_l2, run_dssup
from sup_helpers import WORKERS, of

from tests.memprobe import cap_between, probe

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

JOB = ["--steps", "6"]
TORCHRUN = ["--", "torchrun", "--standalone", "--nproc-per-node", "2"]
SLOW_GRACE = ["--grace", "30"]  # a supervisor that waits out its grace takes >= 30 s
SLOW_WRONG_PATHS = [*SLOW_GRACE, "--backoff", "30"]  # ... and one that backs off a remedy
TAKEOVER_BOUND_S = 10.0
PROBE = str(WORKERS / "probe_tiny.py")


@pytest.fixture(scope="module")
def ref_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    return reference(tmp_path_factory.mktemp("ref") / "ref.pt", *JOB)


def _one_attempt_in_process(tmp_path, ref_weights, phase: str, *extra: str) -> None:
    run, out = tmp_path / "run", tmp_path / "final.pt"
    code, text, rec = run_dssup(
        run, "--global-batch-size", "32", "--checkpoint-dir", str(tmp_path / "ckpt"),
        *TORCHRUN, str(EXAMPLE), *JOB, *extra,
        "--memory-cap-at", phase, "--memory-cap-ranks", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert f"memory cap: rank 1 at {phase} of step 4" in text, "the device was sized at step 4"
    assert len(attempts(rec)) == 1, "an in-process recovery must not restart"
    remedies = of(rec, "inprocess-remedy")
    assert len(remedies) == 1, remedies
    r = remedies[0]
    assert (r["step"], r["oom_ranks"], r["oom_phases"]) == (4, [1], [phase])
    assert sorted(r["reported_by"]) == [0, 1], "both ranks moved to the finer split"
    assert r["global_batch"] == 32 and r["micro_batch"] * r["grad_accum"] * 2 == 32
    assert r["micro_batch"] == r["old_micro_batch"] // 2
    moved = of(rec, "decision")[-1]
    assert moved["action"] == "in-process" and moved["plan"]["micro_batch"] == r["micro_batch"]
    assert of(rec, "job-report")[0]["batch"]["status"] == "verified"
    assert of(rec, "run-ended")[0]["final_plan"]["micro_batch"] == r["micro_batch"]
    assert "no restart" in text or "in-process" in text
    assert relative_l2(torch.load(out), ref_weights) < 1e-5


def test_forward_oom_on_one_rank_is_redone_in_process(tmp_path, ref_weights):
    _one_attempt_in_process(tmp_path, ref_weights, "forward", "--micro-batch-size", "16")


def test_backward_oom_on_one_rank_is_redone_in_process(tmp_path, ref_weights):
    _one_attempt_in_process(tmp_path, ref_weights, "backward", "--micro-batch-size", "16")


def test_fsdp2_forward_oom_before_the_synchronising_micro_batch(tmp_path, ref_weights):
    """FSDP2 syncs in the last micro-batch's backward; an OOM in an earlier one is redone."""
    extra = ["--micro-batch-size", "8", "--gradient-accumulation-steps", "2", "--fsdp"]
    _one_attempt_in_process(tmp_path, ref_weights, "forward", *extra)


def test_rank_killed_mid_backward_the_supervisor_takes_over(tmp_path, ref_weights):
    run, out = tmp_path / "run", tmp_path / "final.pt"
    code, text, rec = run_dssup(
        run, "--global-batch-size", "32", "--micro-batch-size", "8", *SLOW_GRACE,
        "--checkpoint-dir", str(tmp_path / "ckpt"), *TORCHRUN,
        str(WORKERS / "guarded_kill.py"), *JOB, "--kill-rank", "1", "--kill-step", "3",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, text[-4000:]
    starts = attempts(rec)
    assert len(starts) == 2, "finished by one restart"
    assert starts[1]["resume_step"] == 2 and starts[1]["plan"]["micro_batch"] == 8
    gave_up = of(rec, "inprocess-gave-up")
    assert len(gave_up) == 1 and gave_up[0]["attempt"] == 1
    assert gave_up[0]["reason"] in {"peer-lost", "not-recoverable-in-process"}, gave_up
    killed_at = float((run / "attempt-001" / "killed-at").read_text())
    took = starts[1]["ts"] - killed_at
    assert took < TAKEOVER_BOUND_S, f"the supervisor took {took:.1f} s to take over"
    print(f"takeover after the kill: {took:.2f} s")
    assert relative_l2(torch.load(out), ref_weights) < 1e-5


def test_oom_at_micro_batch_1_goes_to_the_restart_path(tmp_path):
    job = ["--steps", "5", "--long-seq-len", "1024", "--layers", "8"]
    need = probe(PROBE, "--layers", "8", "--seq-len", "1024", "1:4:none", "1:4:selective")
    cap = cap_between(need["1:4:none"], need["1:4:selective"], "micro-batch 1 at length 1024")
    ref = reference(
        tmp_path / "ref.pt", *job, "--global-batch-size", "8", "--micro-batch-size", "1"
    )
    run, out = tmp_path / "run", tmp_path / "final.pt"
    code, text, rec = run_dssup(
        run, "--global-batch-size", "8", "--micro-batch-size", "4", *SLOW_WRONG_PATHS,
        "--checkpoint-dir", str(tmp_path / "ckpt"), *TORCHRUN, str(EXAMPLE), *job,
        "--memory-cap-mib", str(cap), "--memory-cap-ranks", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 0, text[-4000:]
    walk = [(r["old_micro_batch"], r["micro_batch"]) for r in of(rec, "inprocess-remedy")]
    assert walk == [(4, 2), (2, 1)]
    gave_up = of(rec, "inprocess-gave-up")
    assert [g["reason"] for g in gave_up] == ["micro-batch-floor"] and 1 in gave_up[0]["ranks"]
    assert [d["action"] for d in of(rec, "decision")] == ["in-process", "remedy"]
    starts = attempts(rec)
    assert len(starts) == 2
    plan = starts[1]["plan"]
    assert (plan["micro_batch"], plan["grad_accum"], plan["recompute"]) == (1, 4, "selective")
    assert starts[1]["resume_step"] == 4
    report = [
        json.loads(x) for x in (run / "attempt-001" / "report.jsonl").read_text().splitlines()
    ]
    quit_ts = min(x["ts"] for x in report if x["type"] == "inprocess-gave-up")
    took = starts[1]["ts"] - quit_ts
    assert took < TAKEOVER_BOUND_S, f"the supervisor took {took:.1f} s to take over"
    print(f"takeover after the guard gave up: {took:.2f} s (cap {cap} MiB)")
    assert relative_l2(torch.load(out), ref) < 1e-5
