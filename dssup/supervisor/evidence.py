"""Everything an ended attempt left behind, read back without trusting any single source.

Sources, per attempt directory: torchrun's copy of the root cause (``root_cause.json``, from
``TORCHELASTIC_ERROR_FILE`` on torchrun itself, with ``errorCode``), each rank's own
``error.json``/``stderr.log`` under the per-attempt ``--log-dir``, torchrun's console output with
its ``ChildFailedError`` table (every failed rank's exit code, including those killed by a
signal, which write no error file), "done" markers written by ``dssup.runtime.clean_exit`` and
``completed`` records of the job-side report, and the OOM-kill counters of our cgroup subtree.
torchrun orders root causes by whole-second timestamps, so dssup reads every rank's file itself.
A rank without an error file (no ``@record``, or a launcher that writes none) is judged from
its output: the last traceback gives the exception and the call stack (so the phase), and
whether it ended the process; a message that ends a process by itself (Python's "can't open
file", an argparse error, a Rust allocation abort) counts too. The launcher says where the
per-rank files are (``Launcher.rank_logs``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from dssup.jobreport import Completed, read_report
from dssup.supervisor.launchers.base import RankLogSource
from dssup.supervisor.launchers.torchrun import TORCHRUN
from dssup.supervisor.report import report_path
from dssup.supervisor.signatures import match
from dssup.supervisor.tracebacks import last_exception, last_traceback, strip_prefixes

__all__ = [
    "AttemptEvidence",
    "RankEvidence",
    "collect",
    "last_exception",
    "parse_failure_table",
    "read_error_file",
]

_TABLE_ROW = re.compile(
    r"^\s*time\s*:\s*(?P<time>\S+)\s*$.*?"
    r"^\s*rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*$\s*"
    r"^\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)",
    re.MULTILINE | re.DOTALL,
)
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


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-64_000:].decode(errors="replace")
    except OSError:
        return ""
    return strip_prefixes("\n".join(data.splitlines()[-lines:]))


def collect(
    attempt_dir: Path,
    exit_code: int,
    console_tail: str,
    log_dir: Path | None = None,
    oom_kills: int = 0,
    world_size: int = 1,
    launcher: RankLogSource = TORCHRUN,
) -> AttemptEvidence:
    """Gather every source for one ended attempt (``launcher`` says where its rank logs are)."""
    ranks: dict[int, RankEvidence] = {}
    for local, files in launcher.rank_logs(log_dir or attempt_dir / "logs").items():
        ev = RankEvidence(local_rank=local, rank=files.rank if files.rank is not None else local)
        doc = read_error_file(files.error_file) if files.error_file is not None else None
        if doc is not None:
            ev.message = str(doc["message"])
            ev.callstack = str(doc["callstack"])
            ev.timestamp = doc["timestamp"]  # type: ignore[assignment]
            ev.sources.append("error-file")
        ev.stderr_tail = _tail(files.output)
        if ev.stderr_tail:
            ev.sources.append("stderr")
            _from_output(ev)
        ranks[local] = ev
    for row in parse_failure_table(console_tail):
        ev = ranks.setdefault(row["local_rank"], RankEvidence(local_rank=row["local_rank"]))
        ev.rank, ev.exit_code = row["rank"], row["exit_code"]
        ev.sources.append("exit-code")
    done = {int(p.name.split("-")[1]) for p in (attempt_dir / "done").glob("rank-*")}
    # only the script's own end counts; a training loop's end (final=False) is read by JobView
    done |= {r.rank for r in read_report(report_path(attempt_dir)).of(Completed) if r.final}
    return AttemptEvidence(
        exit_code=exit_code,
        ranks=ranks,
        root_cause=read_error_file(attempt_dir / "root_cause.json"),
        console_tail=console_tail,
        done_ranks=done,
        oom_kills=oom_kills,
        world_size=world_size,
    )


def _from_output(ev: RankEvidence) -> None:
    """Without an error file: the exception, call stack and fate read from the rank's output."""
    tb = last_traceback(ev.stderr_tail)
    if tb is not None and not ev.callstack:
        ev.callstack = tb.callstack
    if not ev.message:
        ev.message = tb.exception if tb is not None else last_exception(ev.stderr_tail)
    if tb is not None and tb.uncaught:
        ev.sources.append("uncaught-traceback")
    elif (sig := match(ev.stderr_tail)) is not None and sig.fatal:
        ev.sources.append("fatal-message")
        ev.message = ev.message or _line_of(sig.pattern, ev.stderr_tail)


def _line_of(pattern: re.Pattern[str], text: str) -> str:
    """The (last) line of ``text`` a pattern matches: the message when no exception names it."""
    lines = [ln for ln in text.splitlines() if pattern.search(ln)]
    return lines[-1].strip() if lines else ""
