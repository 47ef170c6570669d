"""A test that times out leaves nothing running: ``dssup run`` around a real torchrun job is
cut off by ``run_reaped``'s timeout while its workers train, the test fails, and no process of
the run (supervisor, torchrun, workers: found by their ``DSSUP_RUN_TOKEN``) is left alive."""

import os

import pytest
from sup_helpers import DSSUP, WORKERS, journal, of, token_processes

from tests.procs import run_reaped

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]


def test_a_timed_out_run_leaves_no_process_behind(tmp_path):
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    cmd = [DSSUP, "run", "--run-dir", str(run), "--checkpoint-dir", str(ckpt), "--",
           "torchrun", "--standalone", "--nproc-per-node", "2", str(WORKERS / "sleeper.py")]  # fmt: skip
    env = {**os.environ, "SLEEPER_STEPS": "10000"}  # ~50 min: only the timeout ends it
    with pytest.raises(pytest.fail.Exception, match="timed out after 30 s"):
        run_reaped(cmd, 30, run, cwd=tmp_path, env=env)
    run_id = of(journal(run), "run-started")[0]["run_id"]
    assert list(ckpt.glob("step_*")), "the workers never trained: nothing was tested"
    assert token_processes(f"{run_id}/") == []
