"""Plain argparse scripts through the real ``dssup run``: a real allocator OOM on rank 1
(address-space cap) at micro-batch 16, and the accumulation flag not on the command line.
The global batch stays 32 and the job says so; or the remedy is refused with what to add; or
the job's report catches a script that ignored what it was given; and without a report the
summary says "unverified", never "unchanged"."""

import subprocess

import pytest
from sup_helpers import DSSUP, WORKERS, dssup_run, journal, of

from tests.memprobe import MALLOC  # the capped workers' glibc settings, not the caller's

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]
REPORTING = str(WORKERS / "plain_flags.py")


def _run(tmp_path, script: str, *args: str):
    run = tmp_path / "run"
    res = dssup_run(
        run, "--global-batch-size", "32", "--micro-batch-size", "16", "--",
        "torchrun", "--standalone", "--nproc-per-node", "2", script, "--micro-batch-size", "16",
        *args, env=MALLOC,
    )  # fmt: skip
    return run, res, journal(run)


def test_with_the_accumulation_flag_on_the_command_line_the_job_confirms_32(tmp_path):
    run, res, rec = _run(tmp_path, REPORTING, "--gradient-accumulation-steps", "1")
    assert res.returncode == 0, res.stdout[-3000:]
    second = of(rec, "attempt-started")[1]["argv"]
    assert second[second.index("--gradient-accumulation-steps") + 1] == "2"
    assert [r["batch"]["status"] for r in of(rec, "job-report")] == ["verified", "verified"]
    assert "global batch 32 (verified by the job in every attempt)" in res.stdout
    status = subprocess.run([DSSUP, "status", str(run)], capture_output=True, text=True, check=True)
    assert "rank 1 started from scratch: micro-batch 8 x accumulation 2 x 2 data-parallel" in (
        status.stdout
    )
    assert "global batch 32 (verified by the job in every attempt)" in status.stdout


def test_without_the_flag_a_script_that_reads_the_environment_keeps_32(tmp_path):
    """No accumulation flag on the command line; the script reads DSSUP_GRAD_ACCUM_STEPS (its
    source names it): the doubled accumulation goes through the environment, the job's own
    report confirms 32 in both attempts, and ``dssup status`` says so."""
    run, res, rec = _run(tmp_path, REPORTING, "--read-env", "grad_accum")
    assert res.returncode == 0, res.stdout[-3000:]
    accumulation = of(rec, "handoff")[0]["channels"]["grad_accum"]
    assert (accumulation["via"], accumulation["name"]) == ("env", "DSSUP_GRAD_ACCUM_STEPS")
    starts = of(rec, "attempt-started")
    assert [(s["plan"]["micro_batch"], s["plan"]["grad_accum"]) for s in starts] == [
        (16, 1),
        (8, 2),
    ]
    assert "--gradient-accumulation-steps" not in starts[1]["argv"]  # never added
    assert starts[1]["env"]["DSSUP_GRAD_ACCUM_STEPS"] == "2"
    reports = of(rec, "job-report")
    assert [r["batch"]["status"] for r in reports] == ["verified", "verified"]
    assert [r["batch"]["reported"] for r in reports] == [[32], [32]]
    assert "global batch 32 (verified by the job in every attempt)" in res.stdout
    status = subprocess.run([DSSUP, "status", str(run)], capture_output=True, text=True,
                            check=True, timeout=60)  # fmt: skip
    assert "global batch 32 (verified by the job in every attempt)" in status.stdout
    assert "unchanged" not in res.stdout + status.stdout


def test_a_script_that_cannot_receive_the_accumulation_is_not_halved(tmp_path):
    run, res, rec = _run(tmp_path, str(WORKERS / "argparse_only.py"))
    assert res.returncode == 1, res.stdout[-3000:]
    assert len(of(rec, "attempt-started")) == 1
    give_up = of(rec, "decision")[0]
    assert give_up["action"] == "give-up"
    assert "accumulation 1 -> 2 cannot reach the script" in give_up["reason"]
    assert (
        "add --gradient-accumulation-steps N to the command (your script defines it)"
        in (give_up["reason"])
    )
    assert "accumulation 1: not received" in res.stdout  # said before attempt 1
    assert "not reported by the job in attempt(s) [1]: unverified" in res.stdout
    status = subprocess.run([DSSUP, "status", str(run)], capture_output=True, text=True,
                            check=False, timeout=60)  # fmt: skip
    assert "not reported by the job in attempt(s) [1]: unverified" in status.stdout
    assert "unchanged" not in res.stdout + status.stdout


def test_a_job_that_ignores_the_accumulation_it_was_given_fails_the_run(tmp_path):
    """Its source names DSSUP_GRAD_ACCUM_STEPS, so dssup hands the doubled accumulation over
    the environment; the script does not use it and trains at global batch 16: its own report
    shows it, the attempt is stopped, and the run fails with 3."""
    _, res, rec = _run(tmp_path, REPORTING, "--read-env", "micro_batch")
    assert res.returncode == 3, res.stdout[-3000:]
    reports = of(rec, "job-report")
    assert [r["batch"]["status"] for r in reports] == ["verified", "mismatch"]
    assert reports[1]["batch"]["reported"] == [16]
    ended = of(rec, "run-ended")[0]
    assert ended["outcome"] == "batch-mismatch" and ended["exit_code"] == 3
    assert "global batch MISMATCH: dssup keeps global batch 32, but rank" in res.stdout
    assert "unchanged" not in res.stdout


def test_without_the_jobs_report_the_global_batch_is_unverified(tmp_path):
    run, res, rec = _run(tmp_path, REPORTING, "--gradient-accumulation-steps", "1", "--no-report")
    assert res.returncode == 0, res.stdout[-3000:]
    assert [r["batch"]["status"] for r in of(rec, "job-report")] == ["unreported"] * 2
    unverified = "global batch 32 planned; not reported by the job in attempt(s) [1, 2]: unverified"
    assert unverified in res.stdout
    status = subprocess.run([DSSUP, "status", str(run)], capture_output=True, text=True,
                            check=True, timeout=60)  # fmt: skip
    assert unverified in status.stdout
    assert "unchanged" not in res.stdout + status.stdout
