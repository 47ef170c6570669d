"""The job-side report through the real ``dssup run``: a plain argparse worker under torchrun,
a real allocator OOM on rank 1 (address-space cap), the remedy halves the micro-batch, and
what the job then reports decides what dssup says about the global batch."""

import subprocess

import pytest
from sup_helpers import DSSUP, WORKERS, dssup_run, journal, of

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]
WORKER = str(WORKERS / "plain_flags.py")


def _run(tmp_path, read_env: str):
    run = tmp_path / "run"
    res = dssup_run(
        run, "--global-batch-size", "32", "--micro-batch-size", "16", "--",
        "torchrun", "--standalone", "--nproc-per-node", "2", WORKER,
        "--micro-batch-size", "16", "--read-env", read_env,
    )  # fmt: skip
    return run, res, journal(run)


def test_a_job_that_ignores_the_accumulation_it_was_given_fails_the_run(tmp_path):
    """The issue's case: micro-batch halved, accumulation never reached the script, which
    trained at global batch 16; the job's own report shows it and the run fails with 3."""
    _, res, rec = _run(tmp_path, "micro_batch")
    assert res.returncode == 3, res.stdout[-3000:]
    reports = of(rec, "job-report")
    assert [r["batch"]["status"] for r in reports] == ["verified", "mismatch"]
    assert reports[1]["batch"]["reported"] == [16]
    ended = of(rec, "run-ended")[0]
    assert ended["outcome"] == "batch-mismatch" and ended["exit_code"] == 3
    assert "global batch MISMATCH: dssup keeps global batch 32, but rank" in res.stdout
    assert "unchanged" not in res.stdout


def test_a_job_that_follows_the_plan_is_verified_by_its_own_report(tmp_path):
    run, res, rec = _run(tmp_path, "micro_batch,grad_accum")
    assert res.returncode == 0, res.stdout[-3000:]
    assert [r["batch"]["status"] for r in of(rec, "job-report")] == ["verified", "verified"]
    assert "global batch 32 (verified by the job in every attempt)" in res.stdout
    status = subprocess.run([DSSUP, "status", str(run)], capture_output=True, text=True, check=True)
    assert "rank 1 started from scratch: micro-batch 8 x accumulation 2 x 2 data-parallel" in (
        status.stdout
    )
    assert "global batch 32 (verified by the job in every attempt)" in status.stdout
