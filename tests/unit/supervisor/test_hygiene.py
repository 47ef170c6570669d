"""Restart hygiene with real processes and real counter files: tokens, stragglers, OOM kills."""

import os
import subprocess
import sys
import time

from dssup.supervisor.hygiene import oom_kill_count, wait_gpu_released
from dssup.supervisor.process import processes_with_token, terminate_token, wait_gone

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def _spawn(token, code="import time; time.sleep(60)"):
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "DSSUP_RUN_TOKEN": token},
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc


def test_token_scan_finds_exactly_the_attempts_processes():
    token = f"hyg-{os.getpid()}-{time.time_ns()}"
    a, b = _spawn(f"{token}/1"), _spawn(f"{token}/12")
    try:
        deadline = time.monotonic() + 10
        while len(processes_with_token(f"{token}/1")) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with_token(f"{token}/1") == [a.pid]
        assert processes_with_token(f"{token}/12") == [b.pid]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
            p.stdout.close()
    assert wait_gone(f"{token}/1", 5) == []


def test_stragglers_that_ignore_sigterm_are_killed():
    token = f"hyg-{os.getpid()}-{time.time_ns()}/1"
    proc = _spawn(token, STUBBORN)
    assert proc.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    killed = terminate_token(token, grace=0.5)
    assert killed == [proc.pid]
    assert proc.wait(5) == -9 and time.monotonic() - t0 < 5
    proc.stdout.close()


def test_oom_kill_counters_v1_subtree_and_v2(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (tmp_path / "a" / "b" / "memory.oom_control").write_text("oom_kill_disable 0\noom_kill 2\n")
    assert oom_kill_count(tmp_path, "v1") == 3
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert oom_kill_count(v2, "v2") == 2
    assert oom_kill_count() >= 0  # our own cgroup, whatever this machine has


def test_gpu_release_wait_without_nvml_or_gpu_returns_at_once():
    t0 = time.monotonic()
    assert wait_gpu_released([os.getpid()], timeout=5) is True
    assert time.monotonic() - t0 < 5
