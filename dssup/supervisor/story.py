"""The journal retold: a summary (numbers) and a story (plain sentences) of one run.

Both read the journal only, so ``dssup status`` works on a finished run, a running one, or one
whose supervisor was killed, and ``dssup run`` prints the same summary at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dssup.supervisor.journal import Journal

__all__ = ["Summary", "story", "summarize"]


@dataclass
class Summary:
    outcome: str
    attempts: int
    failures: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    global_batches: list[int | None] = field(default_factory=list)
    time_lost_s: float = 0.0
    wall_s: float = 0.0
    relaunch_overheads_s: list[float] = field(default_factory=list)
    final_plan: dict[str, Any] = field(default_factory=dict)

    @property
    def global_batch_unchanged(self) -> bool:
        return len(set(self.global_batches)) <= 1


def _change_text(changes: dict[str, list[Any]]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items())


def summarize(journal: Journal) -> Summary:
    ended = journal.last("run-ended")
    s = Summary(outcome=ended["outcome"] if ended else "running", attempts=0)
    for rec in journal.records:
        if rec["type"] == "attempt-started":
            s.attempts += 1
            s.global_batches.append(rec["plan"].get("global_batch"))
            if rec.get("relaunch_overhead_s") is not None:
                s.relaunch_overheads_s.append(rec["relaunch_overhead_s"])
        elif rec["type"] == "attempt-ended" and rec.get("failure"):
            f = rec["failure"]
            if f["kind"] != "teardown":
                s.failures.append(f"attempt {rec['attempt']}: {f['kind']} on rank {f.get('rank')}")
                s.time_lost_s += rec.get("duration_s") or 0.0
        elif rec["type"] == "decision" and rec.get("action") == "remedy":
            s.changes.append(f"{rec['step']}: {_change_text(rec.get('changes', {}))}")
    if journal.records:
        s.wall_s = round(journal.records[-1]["ts"] - journal.records[0]["ts"], 3)
    s.time_lost_s = round(s.time_lost_s + sum(s.relaunch_overheads_s), 3)
    s.final_plan = (ended or {}).get("final_plan") or {}
    return s


def _sentence(rec: dict[str, Any]) -> str | None:
    t = rec["type"]
    if t == "run-started":
        return f"Run {rec['run_id']} started: {' '.join(rec['command'])}"
    if t == "attempt-started":
        p = rec["plan"]
        frm = (
            f" resuming from step {rec['resume_step']}"
            if rec.get("resume_from")
            else " from scratch"
        )
        return (
            f"Attempt {rec['attempt']}: micro-batch {p.get('micro_batch')}, accumulation "
            f"{p.get('grad_accum')}, global batch {p.get('global_batch')},{frm}."
        )
    if t == "attempt-ended":
        f = rec.get("failure")
        if not f:
            return f"Attempt {rec['attempt']} finished successfully in {rec.get('duration_s')} s."
        where = f" on rank {f['rank']}" if f.get("rank") is not None else ""
        step = rec.get("checkpoint_step")
        saved = f"; latest checkpoint: step {step}" if step is not None else ""
        return f"Attempt {rec['attempt']} ended: {f['kind']}{where} ({f['message'][:140]}){saved}."
    if t == "continuity":
        return (
            f"Attempt {rec['attempt']} judged by {rec.get('adapter')}: {rec.get('verdict')}"
            f"{'' if rec.get('ok', True) else ' (the recovery FAILED)'}: {rec.get('detail', '')}"
        )
    if t == "decision":
        return (
            f"Decision after attempt {rec.get('after_attempt')}: {rec['action']}: {rec['reason']}."
        )
    if t == "supervisor-restarted":
        return f"Supervisor restarted; lost attempt {rec.get('lost_attempt')}, orphans killed: {rec.get('killed')}."
    if t == "run-ended":
        return f"Run {rec['outcome']} (exit {rec['exit_code']}): {rec['reason']}."
    return None


def story(journal: Journal) -> list[str]:
    lines = [text for rec in journal.records if (text := _sentence(rec))]
    s = summarize(journal)
    gb = "unchanged" if s.global_batch_unchanged else "CHANGED"
    lines.append(
        f"Summary: {s.outcome}; {s.attempts} attempt(s); global batch {gb} "
        f"({s.global_batches[0] if s.global_batches else '?'}); time lost (upper bound) {s.time_lost_s:.1f} s "
        f"of {s.wall_s:.1f} s."
    )
    return lines
