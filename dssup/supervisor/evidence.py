"""Everything an ended attempt left behind, read back without trusting any single source.

Sources, per attempt directory: torchrun's copy of the root cause (``root_cause.json``, from
``TORCHELASTIC_ERROR_FILE`` on torchrun itself, with ``errorCode``), each rank's own
``error.json``/``stderr.log`` under the per-attempt ``--log-dir``, torchrun's console output with
its ``ChildFailedError`` table (every failed rank's exit code, including those killed by a
signal, which write no error file), "done" markers written by ``dssup.runtime.clean_exit`` and
``completed`` records of the job-side report, and the OOM-kill counters of our cgroup subtree.
torchrun orders root causes by whole-second timestamps, so dssup reads every rank's file itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from dssup.jobreport import Completed, read_report
from dssup.supervisor.report import report_path

__all__ = ["AttemptEvidence", "RankEvidence", "collect", "parse_failure_table", "read_error_file"]

_TABLE_ROW = re.compile(
    r"^\s*time\s*:\s*(?P<time>\S+)\s*$.*?"
    r"^\s*rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*$\s*"
    r"^\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)",
    re.MULTILINE | re.DOTALL,
)
_EXC_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?", re.MULTILINE)
TAIL_LINES = 80


@dataclass
class RankEvidence:
    local_rank: int
    rank: int | None = None
    exit_code: int | None = None
    message: str = ""
    callstack: str = ""
    timestamp: int | None = None
    stderr_tail: str = ""
    sources: list[str] = field(default_factory=list)


@dataclass
class AttemptEvidence:
    exit_code: int
    ranks: dict[int, RankEvidence]  # by local rank
    root_cause: dict[str, object] | None
    console_tail: str
    done_ranks: set[int]
    oom_kills: int = 0
    world_size: int = 1


def read_error_file(path: Path) -> dict[str, object] | None:
    """torchelastic's error JSON, either format; None when absent or unreadable."""
    try:
        doc = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    msg = doc.get("message")
    if isinstance(msg, dict):
        info = msg.get("extraInfo") or {}
        ts = info.get("timestamp")
        return {
            "message": str(msg.get("message", "")),
            "callstack": str(info.get("py_callstack", "")),
            "timestamp": int(str(ts)) if str(ts).isdigit() else None,
            "error_code": msg.get("errorCode"),
        }
    if isinstance(msg, str):
        flat = doc.get("timestamp")
        return {
            "message": msg,
            "callstack": "",
            "timestamp": flat if isinstance(flat, int) else None,
        }
    return None


def parse_failure_table(text: str) -> list[dict[str, int]]:
    """Rows of torchrun's ``ChildFailedError`` table: rank, local_rank, exit_code, pid."""
    rows = []
    for m in _TABLE_ROW.finditer(text):
        rows.append(
            {
                "rank": int(m.group("rank")),
                "local_rank": int(m.group("local")),
                "exit_code": int(m.group("code")),
                "pid": int(m.group("pid")),
            }
        )
    return rows


def last_exception(text: str) -> str:
    """The last ``SomethingError: ...`` line of a traceback tail."""
    for line in reversed(text.splitlines()):
        if m := _EXC_LINE.match(line.strip()):
            return m.group(1).strip()
    return ""


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-64_000:].decode(errors="replace")
    except OSError:
        return ""
    return _RANK_PREFIX.sub("", "\n".join(data.splitlines()[-lines:]))


def _rank_dirs(log_dir: Path) -> dict[int, Path]:
    """``<log_dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/`` of the newest torchrun run."""
    runs = sorted(log_dir.glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return {}
    return {int(p.name): p for p in runs[-1].iterdir() if p.is_dir() and p.name.isdigit()}


def collect(
    attempt_dir: Path,
    exit_code: int,
    console_tail: str,
    log_dir: Path | None = None,
    oom_kills: int = 0,
    world_size: int = 1,
) -> AttemptEvidence:
    """Gather every source for one ended attempt."""
    ranks: dict[int, RankEvidence] = {}
    for local, path in _rank_dirs(log_dir or attempt_dir / "logs").items():
        ev = RankEvidence(local_rank=local, rank=local)
        if (doc := read_error_file(path / "error.json")) is not None:
            ev.message = str(doc["message"])
            ev.callstack = str(doc["callstack"])
            ev.timestamp = doc["timestamp"]  # type: ignore[assignment]
            ev.sources.append("error-file")
        ev.stderr_tail = _tail(path / "stderr.log")
        if ev.stderr_tail:
            ev.sources.append("stderr")
            ev.message = ev.message or last_exception(ev.stderr_tail)
        ranks[local] = ev
    for row in parse_failure_table(console_tail):
        ev = ranks.setdefault(row["local_rank"], RankEvidence(local_rank=row["local_rank"]))
        ev.rank, ev.exit_code = row["rank"], row["exit_code"]
        ev.sources.append("exit-code")
    done = {int(p.name.split("-")[1]) for p in (attempt_dir / "done").glob("rank-*")}
    done |= {r.rank for r in read_report(report_path(attempt_dir)).of(Completed)}
    return AttemptEvidence(
        exit_code=exit_code,
        ranks=ranks,
        root_cause=read_error_file(attempt_dir / "root_cause.json"),
        console_tail=console_tail,
        done_ranks=done,
        oom_kills=oom_kills,
        world_size=world_size,
    )
