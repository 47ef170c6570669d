"""Each failure class, provoked for real under real torchrun, through the real ``dssup run``:
the verdict, the decision, and that user errors are never retried."""

import pytest
from sup_helpers import WORKERS, dssup_run, journal, memory_cgroup, of, token_processes

# The capped workers' glibc settings, whatever the caller's environment says: with a malloc
# arena reserved before the cap (MALLOC_ARENA_MAX=2 left gloo's thread one), gloo's 32 MiB
# buffer fit in space counted before the cap and the communication OOM never happened.
from tests.memprobe import MALLOC

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]
BATCH = ["--global-batch-size", "16", "--micro-batch-size", "8"]


def _kinds(records):
    return [r["failure"]["kind"] if r["failure"] else None for r in of(records, "attempt-ended")]


def test_cuda_oom_text_gets_allocator_setting_then_smaller_micro_batch(tmp_path):
    run = tmp_path / "run"
    res = dssup_run(
        run,
        *BATCH,
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKERS / "cuda_oom.py"),
    )
    rec = journal(run)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _kinds(rec) == ["cuda-oom", "cuda-oom", None]
    first = of(rec, "attempt-ended")[0]["failure"]
    assert first["rank"] == 1 and first["reserved_unallocated"] > first["tried_to_allocate"]
    assert [d["step"] for d in of(rec, "decision")] == ["alloc-conf", "halve-micro-batch"]
    # a script without dssup.runtime.StepGuard: nothing in-process is journalled or assumed
    assert [r["type"] for r in rec if r["type"].startswith("inprocess")] == []
    starts = of(rec, "attempt-started")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in starts[0]["env"]
    assert starts[1]["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert [s["plan"]["micro_batch"] for s in starts] == [8, 8, 4]
    assert {s["plan"]["global_batch"] for s in starts} == {16}


def test_syntax_error_is_not_retried(tmp_path):
    run = tmp_path / "run"
    res = dssup_run(
        run,
        *BATCH,
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKERS / "syntax_error.py.txt"),
    )
    rec = journal(run)
    assert res.returncode == 1
    assert _kinds(rec) == ["user-error"]
    assert of(rec, "decision") == []
    assert "not retried" in of(rec, "run-ended")[0]["reason"]


def test_load_oom_loads_to_cpu(tmp_path):
    run = tmp_path / "run"
    res = dssup_run(
        run,
        *BATCH,
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKERS / "load_oom.py"),
        env=MALLOC,
    )
    rec = journal(run)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _kinds(rec) == ["load-oom", None]
    assert of(rec, "decision")[0]["step"] == "load-to-cpu"
    assert of(rec, "attempt-started")[1]["env"]["DSSUP_LOAD_TO_CPU"] == "1"


def test_comm_buffer_oom_gives_up_without_cutting_the_batch(tmp_path):
    run = tmp_path / "run"
    res = dssup_run(
        run,
        *BATCH,
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKERS / "comm_oom.py"),
        env=MALLOC,
    )
    rec = journal(run)
    assert res.returncode == 1
    assert _kinds(rec) == ["comm-oom"]
    assert of(rec, "decision")[0]["action"] == "give-up"


def test_teardown_abort_after_completion_is_success(tmp_path):
    run = tmp_path / "run"
    res = dssup_run(
        run,
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKERS / "teardown_abort.py"),
    )
    rec = journal(run)
    assert res.returncode == 0
    assert _kinds(rec) == ["teardown"]
    assert of(rec, "run-ended")[0]["outcome"] == "succeeded"


def test_unknown_failure_is_retried_with_backoff(tmp_path):
    run = tmp_path / "run"
    metrics = tmp_path / "dssup.prom"
    res = dssup_run(
        run,
        "--metrics-textfile",
        str(metrics),
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKERS / "transient.py"),
    )
    rec = journal(run)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _kinds(rec) == ["transient", None]
    retry = of(rec, "decision")[0]
    assert retry["action"] == "retry" and "backoff" in retry["reason"]
    assert of(rec, "attempt-started")[0]["plan"] == of(rec, "attempt-started")[1]["plan"]
    assert token_processes(of(rec, "run-started")[0]["run_id"] + "/") == []
    prom = metrics.read_text()
    assert 'dssup_supervisor_attempts_total{failure_kind="transient"} 1.0' in prom
    assert 'dssup_supervisor_attempts_total{failure_kind="success"} 1.0' in prom
    assert "dssup_supervisor_recovery_seconds_count 1.0" in prom


@pytest.mark.skipif(memory_cgroup() is None, reason="needs a writable cgroup v1 memory hierarchy")
def test_kernel_oom_killer_is_a_host_oom_and_is_remedied(tmp_path):
    run = tmp_path / "run"
    try:
        res = dssup_run(
            run,
            *BATCH,
            "--device",
            "cpu",
            "--",
            "torchrun",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(WORKERS / "cgroup_oom.py"),
        )
    finally:
        for cg in memory_cgroup().glob("dssup-test-*"):
            cg.rmdir()
    rec = journal(run)
    assert res.returncode == 0, res.stderr[-2000:]
    first = of(rec, "attempt-ended")[0]
    assert first["failure"]["kind"] == "host-oom" and first["failure"]["signature"] == "oom-killer"
    assert first["failure"]["signal"] == 9 and first["oom_kills"] >= 1
    assert of(rec, "attempt-started")[1]["plan"]["micro_batch"] == 4


def test_stops_after_attempts_without_progress(tmp_path):
    run = tmp_path / "run"
    res = dssup_run(
        run, *BATCH, "--max-no-progress", "2", "--", "torchrun", "--standalone",
        "--nproc-per-node", "2", str(WORKERS / "cuda_oom.py"), env={"OOM_ABOVE": "0"},
    )  # fmt: skip
    rec = journal(run)
    assert res.returncode == 1
    assert _kinds(rec) == ["cuda-oom", "cuda-oom"]
    assert "2 attempts in a row without progress" in of(rec, "run-ended")[0]["reason"]
    assert "gave-up after 2 attempt(s)" in res.stdout
