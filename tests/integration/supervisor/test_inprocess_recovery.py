"""Acceptance for in-process OOM recovery (``dssup.runtime.StepGuard``), through the real
``dssup run`` around real torchrun with two gloo ranks and real allocator failures.

The job is ``examples/train_guarded.py``: train_tiny's transformer and data, each optimizer
step under the guard. Rank 1 alone caps its address space (``memory_cap``); the sequence
length grows from 32 to 384 at step 4, which is where it runs out of memory. Measured needs of
one micro-batch at length 384 above the cap's base (single process, MiB): micro-batch 16
fails in forward below 66 and in backward from 66 to 76 (its backward needs more than its
forward), micro-batch 8 passes at 60. So a 56 MiB cap gives a forward OOM and 71 MiB a
backward OOM, both on rank 1 only, both fixed by micro-batch 8. The OOM at micro-batch 1
uses length 1024 and 4 layers: micro-batch 1 needs 32-40 MiB, with activation recompute it
fits in 16, so a 24 MiB cap fails at every split and passes only with recompute, which the
supervisor adds after the guard gave up.
"""

from __future__ import annotations

import json

import pytest
import torch
from inproc_helpers import EXAMPLE, attempts, reference, relative_l2, run_dssup
from sup_helpers import WORKERS, of

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

JOB = ["--steps", "6"]
TORCHRUN = ["--", "torchrun", "--standalone", "--nproc-per-node", "2"]


@pytest.fixture(scope="module")
def ref_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    return reference(tmp_path_factory.mktemp("ref") / "ref.pt", *JOB)


def _one_attempt_in_process(tmp_path, ref_weights, cap: str, phase: str, *extra: str) -> None:
    run, out = tmp_path / "run", tmp_path / "final.pt"
    code, text, rec = run_dssup(
        run, "--global-batch-size", "32", "--checkpoint-dir", str(tmp_path / "ckpt"),
        *TORCHRUN, str(EXAMPLE), *JOB, *extra,
        "--memory-cap-mib", cap, "--memory-cap-ranks", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 0, text[-4000:]
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
    _one_attempt_in_process(tmp_path, ref_weights, "56", "forward", "--micro-batch-size", "16")


def test_backward_oom_on_one_rank_is_redone_in_process(tmp_path, ref_weights):
    _one_attempt_in_process(tmp_path, ref_weights, "71", "backward", "--micro-batch-size", "16")


def test_fsdp2_forward_oom_before_the_synchronising_micro_batch(tmp_path, ref_weights):
    """FSDP2 syncs in the last micro-batch's backward; an OOM in an earlier one is redone."""
    extra = ["--micro-batch-size", "8", "--gradient-accumulation-steps", "2", "--fsdp"]
    _one_attempt_in_process(tmp_path, ref_weights, "30", "forward", *extra)


def test_rank_killed_mid_backward_the_supervisor_takes_over(tmp_path, ref_weights):
    run, out = tmp_path / "run", tmp_path / "final.pt"
    code, text, rec = run_dssup(
        run, "--global-batch-size", "32", "--micro-batch-size", "8",
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
    assert starts[1]["ts"] - killed_at < 2.0, "the supervisor must take over within 2 s"
    assert relative_l2(torch.load(out), ref_weights) < 1e-5


def test_oom_at_micro_batch_1_goes_to_the_restart_path(tmp_path):
    job = ["--steps", "5", "--long-seq-len", "1024", "--layers", "4"]
    ref = reference(
        tmp_path / "ref.pt", *job, "--global-batch-size", "8", "--micro-batch-size", "8"
    )
    run, out = tmp_path / "run", tmp_path / "final.pt"
    code, text, rec = run_dssup(
        run, "--global-batch-size", "8", "--micro-batch-size", "4",
        "--checkpoint-dir", str(tmp_path / "ckpt"), *TORCHRUN, str(EXAMPLE), *job,
        "--memory-cap-mib", "24", "--memory-cap-ranks", "1", "--out", str(out),
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
    assert starts[1]["ts"] - quit_ts < 2.0, "the supervisor must take over within 2 s"
    assert relative_l2(torch.load(out), ref) < 1e-5
