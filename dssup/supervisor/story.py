"""The journal retold: a summary (numbers) and a story (plain sentences) of one run.

Both read the journal only, so ``dssup status`` works on a finished run, a running one, or one
whose supervisor was killed, and ``dssup run`` prints the same summary at the end. What the
global batch was is said only from the job's own report (``job-report`` records): "verified by
the job", or "unverified" with the reason; never "unchanged" on the strength of dssup's plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dssup.supervisor.journal import Journal
from dssup.supervisor.report import describe_records
from dssup.supervisor.text import clip

__all__ = ["Summary", "global_batch_text", "story", "summarize"]


@dataclass
class Summary:
    outcome: str
    attempts: int
    failures: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    global_batches: list[int | None] = field(default_factory=list)
    batch_checks: dict[int, dict[str, Any]] = field(default_factory=dict)
    time_lost_s: float = 0.0
    wall_s: float = 0.0
    relaunch_overheads_s: list[float] = field(default_factory=list)
    final_plan: dict[str, Any] = field(default_factory=dict)

    @property
    def global_batch_status(self) -> str:
        """verified (every attempt's job report agrees with the plan), mismatch, changed (the
        plan itself moved), unverified (some attempt did not report), or none (no attempt)."""
        if not self.global_batches:
            return "none"
        statuses = [c.get("status") for c in self.batch_checks.values()]
        if "mismatch" in statuses:
            return "mismatch"
        if len(set(self.global_batches)) > 1:
            return "changed"
        if len(statuses) == self.attempts and all(s == "verified" for s in statuses):
            return "verified"
        return "unverified"


def _change_text(changes: dict[str, list[Any]]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items())


def _on_rank(rank: Any) -> str:
    return f" on rank {rank}" if rank is not None else " (rank unknown)"


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
                s.failures.append(f"attempt {rec['attempt']}: {f['kind']}{_on_rank(f.get('rank'))}")
            if f["kind"] not in {"teardown", "unverified-end"}:  # those trained to the end
                s.time_lost_s += rec.get("duration_s") or 0.0
        elif rec["type"] == "decision" and rec.get("action") in {"remedy", "in-process"}:
            s.changes.append(f"{rec['step']}: {_change_text(rec.get('changes', {}))}")
        elif rec["type"] == "job-report":
            s.batch_checks[rec["attempt"]] = dict(rec.get("batch") or {})
    if journal.records:
        s.wall_s = round(journal.records[-1]["ts"] - journal.records[0]["ts"], 3)
    s.time_lost_s = round(s.time_lost_s + sum(s.relaunch_overheads_s), 3)
    s.final_plan = (ended or {}).get("final_plan") or {}
    return s


def global_batch_text(s: Summary) -> str:
    """One sentence about the global batch, claiming only what the job's reports back."""
    status = s.global_batch_status
    planned = next((g for g in s.global_batches if g is not None), None)
    if status == "none":
        return "global batch: no attempt ran"
    if status == "mismatch":
        bad = next(c for c in s.batch_checks.values() if c.get("status") == "mismatch")
        return f"global batch MISMATCH: {bad.get('detail', '')}"
    if status == "changed":
        return f"global batch CHANGED by the plan: {s.global_batches}"
    if status == "verified":
        reported = next(iter(s.batch_checks.values()))["reported"][0]
        return f"global batch {reported} (verified by the job in every attempt)"
    silent = [
        a for a in range(1, s.attempts + 1) if s.batch_checks.get(a, {}).get("status") != "verified"
    ]
    said = [a for a in range(1, s.attempts + 1) if a not in silent]
    what = f"global batch {planned} planned" if planned is not None else "global batch unknown"
    tail = f"; verified by the job in attempt(s) {said}" if said else ""
    return f"{what}; not reported by the job in attempt(s) {silent}: unverified{tail}"


def _attempt_started(rec: dict[str, Any]) -> str:
    p = rec["plan"]
    if rec.get("resume_from"):
        frm = f" resuming from {rec['resume_from']} (step {rec.get('resume_step')})"
    else:
        frm = " from scratch"
    gb = p.get("global_batch")
    parts = [
        f"micro-batch {p.get('micro_batch')}" if p.get("micro_batch") else "micro-batch unknown"
    ]
    if p.get("grad_accum"):
        parts.append(f"accumulation {p['grad_accum']}")
    parts.append(f"global batch {gb}" if gb is not None else "global batch unknown")
    return f"Attempt {rec['attempt']}: {', '.join(parts)},{frm}."


def _handoff(rec: dict[str, Any]) -> str:
    ch = rec.get("channels") or {}

    def how(knob: str) -> str:
        c = ch.get(knob) or {}
        return str(c.get("name")) if c.get("via", "none") != "none" else "nothing (not received)"

    parts = [f"{label} by {how(k)}" for k, label in (
        ("micro_batch", "micro-batch"), ("grad_accum", "accumulation"),
        ("recompute", "recompute"), ("resume", "resume"))]  # fmt: skip
    where = rec.get("checkpoint_dir") or "no checkpoint directory"
    again = f" (updated after attempt {rec['after_attempt']})" if rec.get("after_attempt") else ""
    text = (f"Hand-off{again} ({rec.get('launcher')}, framework {rec.get('framework')}): "
            f"{'; '.join(parts)}; checkpoints in {where}.")  # fmt: skip
    return text + "".join(f" Warning: {w}." for w in rec.get("warnings") or [])


def _sentence(rec: dict[str, Any]) -> str | None:
    t = rec["type"]
    if t == "run-started":
        return f"Run {rec['run_id']} started: {' '.join(rec['command'])}"
    if t == "attempt-started":
        return _attempt_started(rec)
    if t == "attempt-ended":
        f = rec.get("failure")
        if not f:
            return f"Attempt {rec['attempt']} finished successfully in {rec.get('duration_s')} s."
        where = f" on rank {f['rank']}" if f.get("rank") is not None else ""
        where += f" in the {f['phase']} phase" if f.get("phase") else ""
        step = rec.get("checkpoint_step")
        saved = f"; latest checkpoint: step {step}" if step is not None else ""
        return f"Attempt {rec['attempt']} ended: {f['kind']}{where} ({clip(f['message'], 160)}){saved}."
    if t == "handoff":
        return _handoff(rec)
    if t == "job-report":
        said = "; ".join(describe_records(rec.get("records") or [])) or "no records"
        check = rec.get("batch") or {}
        verdict = check.get("text") or check.get("status", "")
        return f"Attempt {rec['attempt']}, the job's report: {said}. {verdict}."
    if t == "continuity":
        return (
            f"Attempt {rec['attempt']} judged by {rec.get('adapter')}: {rec.get('verdict')}"
            f"{'' if rec.get('ok', True) else ' (the recovery FAILED)'}: {rec.get('detail', '')}"
        )
    if t == "inprocess-remedy":
        where = ", ".join(
            f"rank {r} in {p}" for r, p in zip(rec["oom_ranks"], rec["oom_phases"], strict=False)
        )
        return (
            f"Attempt {rec['attempt']}, in-process: OOM at step {rec['step']} ({where}); every "
            f"rank redid the step with micro-batch {rec['old_micro_batch']} -> "
            f"{rec['micro_batch']}, accumulation {rec['old_grad_accum']} -> {rec['grad_accum']}, "
            f"global batch {rec['global_batch']}; no restart."
        )
    if t == "inprocess-gave-up":
        who = "the job" if rec.get("source") == "job" else "dssup"
        return (
            f"Attempt {rec['attempt']}, in-process recovery gave up ({who}: {rec['reason']}): "
            f"{clip(rec.get('detail', ''), 200)}; the restart path took over."
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
    lines.append(
        f"Summary: {s.outcome}; {s.attempts} attempt(s); {global_batch_text(s)}; time lost "
        f"(upper bound) {s.time_lost_s:.1f} s of {s.wall_s:.1f} s."
    )
    return lines
