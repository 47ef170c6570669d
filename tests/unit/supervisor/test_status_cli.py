"""``dssup status``: the latest run with no argument, a listing for a directory of runs, and
a story that never prints "rank None", "global batch None" or a word cut in half."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from dssup.cli import main
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import TrainingPlan

PLAN = TrainingPlan(micro_batch=16, grad_accum=1, global_batch=32, dp=2, world_size=2)
LONG = "RuntimeError: " + " ".join(["DefaultCPUAllocator can't allocate memory"] * 12)


def _run(run_dir: Path, outcome: str, plan: TrainingPlan = PLAN, rank: int | None = 1) -> None:
    j = Journal(run_dir)
    j.append("run-started", run_id=run_dir.name, command=["torchrun", "t.py"],
             plan=plan.model_dump(mode="json"), config={})  # fmt: skip
    j.append("attempt-started", attempt=1, token="t", plan=plan.model_dump(mode="json"))
    failure = {"kind": "host-oom", "rank": rank, "message": LONG, "phase": "forward"}
    j.append("attempt-ended", attempt=1, exit_code=1, duration_s=2.0, failure=failure)
    j.append("run-ended", outcome=outcome, reason="r", exit_code=1,
             final_plan=plan.model_dump(mode="json"))  # fmt: skip


def test_no_argument_tells_the_latest_run_and_a_directory_lists_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["status"]).exit_code == 2  # nothing there yet: one clear line
    _run(tmp_path / "dssup-runs" / "older", "gave-up")
    _run(tmp_path / "dssup-runs" / "newer", "succeeded")
    latest = runner.invoke(main, ["status"])
    assert latest.exit_code == 0 and "Run newer started" in latest.output
    listing = runner.invoke(main, ["status", "dssup-runs"])
    assert listing.exit_code == 0
    rows = [ln for ln in listing.output.splitlines() if ln.startswith("  ")]
    assert [r.split()[0] for r in rows] == ["newer", "older"]
    assert "succeeded" in rows[0] and "gave-up" in rows[1]


def test_the_story_never_prints_none_or_cuts_a_word(tmp_path):
    unknown = TrainingPlan(dp=2, world_size=2)
    _run(tmp_path / "r", "gave-up", plan=unknown, rank=None)
    out = CliRunner().invoke(main, ["status", str(tmp_path / "r")]).output
    assert "None" not in out
    assert "micro-batch unknown, global batch unknown" in out
    assert "host-oom in the forward phase" in out
    ended = next(ln for ln in out.splitlines() if ln.startswith("Attempt 1 ended"))
    inside = ended.split("(", 1)[1].rsplit(")", 1)[0]
    assert inside.endswith("...") and inside[:-3].split()[-1] in LONG.split()
