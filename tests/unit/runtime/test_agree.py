"""The verdict exchange between two real processes (gloo over TCP) and its watchdog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch]
SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "inprocess" / "agree_pair.py"


def _pair(tmp_path: Path, scenario: str) -> dict:
    init = tmp_path / f"init-{scenario}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(SCRIPT), "{rank}", str(init), scenario]
    peer = subprocess.Popen(
        [c.format(rank=1) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env,
    )  # fmt: skip
    try:
        res = subprocess.run(
            [c.format(rank=0) for c in cmd], capture_output=True, text=True, env=env,
            timeout=90, check=False,
        )  # fmt: skip
        peer.wait(timeout=30)
    finally:
        peer.kill()
        peer.wait()
    assert res.stdout.strip(), res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_every_rank_reads_every_verdict(tmp_path):
    assert _pair(tmp_path, "agree")["verdicts"] == [0, 2]


def test_a_late_rank_trips_the_watchdog(tmp_path):
    got = _pair(tmp_path, "late")
    assert got["raised"] == "VerdictTimeout" and 0.9 < got["waited_s"] < 3.0


def test_a_vanished_rank_is_a_lost_peer(tmp_path):
    got = _pair(tmp_path, "gone")
    assert got["raised"] in {"PeerLost", "VerdictTimeout"}, got
    assert got["waited_s"] < 3.0
