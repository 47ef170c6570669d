"""``DeviceStandIn``: a device sized at a named point, then kept for the next attempt.

Two real processes (the cap is per process): the first holds a 16 MiB tensor, fills the device
there and records the budget; its next 16 MiB allocation fails in torch's own allocator while
a 256 KiB one fits the slack. The second, a later "attempt", caps at the recorded budget from
its start: 16 MiB fits, 32 MiB does not. Sizes are the tensors' own, not a machine's figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.memprobe import MALLOC

pytestmark = [pytest.mark.torch]
MiB = 1 << 20

FIRST = textwrap.dedent("""
    import json, sys, torch
    from dssup.runtime.standin import DeviceStandIn

    def fails(numel):
        try:
            torch.empty(numel)
            return False
        except RuntimeError as exc:
            return "can't allocate memory" in str(exc)

    device = DeviceStandIn(sys.argv[1])
    out = {"started": device.start(), "pending_before": device.pending}
    held = torch.ones(4 << 20)  # 16 MiB, live at the named point
    device.fill()
    out |= {"pending_after": device.pending, "big_fails": fails(4 << 20),
            "small_fits": not fails(64 << 10)}
    print(json.dumps(out))
""")
LATER = textwrap.dedent("""
    import json, sys, torch
    from dssup.runtime.standin import DeviceStandIn

    def fits(numel):
        try:
            torch.empty(numel)
            return True
        except RuntimeError:
            return False

    device = DeviceStandIn(sys.argv[1])
    limit = device.start()
    print(json.dumps({"limit": limit, "pending": device.pending, "fits_16": fits(4 << 20),
                      "fits_32": fits(8 << 20)}))
""")


def _run(code: str, path: Path) -> dict:
    env = {**os.environ, **MALLOC, "RANK": "3"}
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         timeout=120, env=env, check=True)  # fmt: skip
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_device_sized_at_a_point_fails_beyond_it_and_is_kept(tmp_path: Path) -> None:
    template = tmp_path / "cap-{rank}.json"
    first = _run(FIRST, template)
    assert first == {"started": None, "pending_before": True, "pending_after": False,
                     "big_fails": True, "small_fits": True}  # fmt: skip
    kept = json.loads((tmp_path / "cap-3.json").read_text())
    budget = kept["budget_bytes"]
    assert 17 * MiB <= budget < 18 * MiB, "the 16 MiB tensor, its page and the 1 MiB slack"
    assert 16 * MiB <= kept["held_bytes"] < 17 * MiB, "what was held above the start"
    later = _run(LATER, template)
    assert later["limit"] is not None and later["pending"] is False
    assert (later["fits_16"], later["fits_32"]) == (True, False)


def test_fill_before_start_is_refused() -> None:
    from dssup.runtime.standin import DeviceStandIn

    with pytest.raises(RuntimeError, match="before start"):
        DeviceStandIn().fill()


def test_watched_hooks_start_at_the_next_forward_and_fill_once(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import json, sys, torch

        from dssup.runtime.standin import DeviceStandIn

        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        device = DeviceStandIn(sys.argv[1])
        device.watch(model, model[1])
        x = torch.ones(3, 4)
        before = model(x)  # not begun: nothing happens
        untouched = device.base is None and device.limit is None
        device.begin()
        after = model(x)  # starts before this forward, fills at model[1]'s output
        limit = device.limit
        again = model(x)  # filled once only
        print(json.dumps({"same": bool(torch.equal(before, after) and torch.equal(after, again)),
                          "untouched": untouched, "filled": limit is not None,
                          "once": device.limit == limit, "pending": device.pending}))
    """)
    got = _run(code, tmp_path / "cap.json")
    assert got == {"same": True, "untouched": True, "filled": True, "once": True,
                   "pending": False}  # fmt: skip
    assert (tmp_path / "cap.json").exists()


def test_a_rank_that_kept_no_budget_takes_its_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 3 found the device's size; rank 5 was stopped before its named point. In the next
    attempt rank 5 caps at rank 3's budget instead of sizing its device anew (at what would
    then be a smaller micro-batch)."""
    from dssup.runtime.standin import DeviceStandIn

    (tmp_path / "cap-3.json").write_text(json.dumps({"budget_bytes": 20 * MiB}))
    (tmp_path / "cap-4.json.partial").write_text("{")  # a write cut off: never read
    monkeypatch.setenv("RANK", "5")
    device = DeviceStandIn(tmp_path / "cap-{rank}.json")
    assert device.path == tmp_path / "cap-5.json"
    assert device.recorded_budget() == 20 * MiB
    assert DeviceStandIn(tmp_path / "cap.json").recorded_budget() is None  # no {rank}: own only
