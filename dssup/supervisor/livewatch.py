"""Watching an attempt while it runs: each rank's output, and the job's own report.

Fast fail must not depend on ``@record``. A rank that dies of an OOM prints its traceback to
stderr (the frames, then the exception line) *before* the slow part of dying: unwinding,
tearing down the process group, torchrun noticing and stopping the others. ``OutputWatch``
tails every rank's output file (the launcher says where: ``Launcher.rank_logs``) and stops the
attempt when a rank prints

* a traceback that propagated out of the script (its outermost frame is the script's top
  level: the process is exiting) ending in an OOM or a user error that is not a cascade; the
  phase comes from the traceback's frames;
* or a message that ends a process by itself (``can't open file``, an argparse usage error, a
  Rust allocation abort); see ``signatures.Signature.fatal``.

Launchers that keep each rank's output only in files (the deepspeed launcher) get it copied to
the console with a ``[rankN]:`` prefix (``echo``).

``ReportWatch`` reads the job-side report as it grows: the first record that shows a global
batch other than the one dssup keeps stops the attempt too (training on would only produce a
checkpoint of the wrong run).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dssup.jobreport import ReportRecord, parse_record
from dssup.supervisor.classify import classify_rank
from dssup.supervisor.evidence import RankEvidence
from dssup.supervisor.fastfail import STOP_KINDS
from dssup.supervisor.launchers.base import RankLogSource
from dssup.supervisor.models import RankFailure
from dssup.supervisor.report import BatchCheck, check_batch
from dssup.supervisor.signatures import match
from dssup.supervisor.tracebacks import EXCEPTION_LINE, last_traceback, strip_prefixes

__all__ = ["STOP_KINDS", "OutputWatch", "ReportWatch"]

_KEEP = 96_000  # bytes of recent output kept per rank: a long traceback fits


@dataclass
class _Tail:
    offset: int = 0
    partial: bytes = b""
    text: str = ""
    lines: list[str] = field(default_factory=list)

    def read(self, path: Path) -> list[str]:
        """New complete lines since the last read."""
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        new = [c.decode(errors="replace") for c in chunks]
        if new:
            self.text = (self.text + "\n" + "\n".join(new))[-_KEEP:]
        return new


class OutputWatch:
    """Polls every rank's output for a dying traceback or a fatal message (module doc)."""

    def __init__(
        self,
        log_dir: Path,
        launcher: RankLogSource,
        every_s: float = 0.05,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.log_dir, self.launcher, self.every_s, self.echo = log_dir, launcher, every_s, echo
        self._next = 0.0
        self._tails: dict[Path, _Tail] = {}

    def poll(self, force: bool = False) -> RankFailure | None:
        now = time.monotonic()
        if now < self._next and not force:
            return None
        self._next = now + self.every_s
        found: RankFailure | None = None
        for local, files in sorted(self.launcher.rank_logs(self.log_dir).items()):
            tail = self._tails.setdefault(files.output, _Tail())
            new = tail.read(files.output)
            if not new:
                continue
            rank = files.rank if files.rank is not None else local
            if self.echo is not None:
                for line in new:
                    self.echo(f"[rank{rank}]: {line}")
            if found is None:
                found = self._judge(tail.text, new, local, rank)
        return found

    def _judge(self, text: str, new: list[str], local: int, rank: int) -> RankFailure | None:
        plain = [strip_prefixes(ln).rstrip() for ln in new]
        fresh = "\n".join(plain)
        sig = match(fresh)
        if sig is not None and sig.fatal and sig.kind in STOP_KINDS:
            line = next((ln for ln in plain if sig.pattern.search(ln)), "").strip()
            tb = last_traceback(text)
            ev = RankEvidence(local_rank=local, rank=rank, message=line,
                              callstack=tb.callstack if tb else "", sources=["live-stderr"])  # fmt: skip
            verdict = classify_rank(ev)
            if verdict.kind in STOP_KINDS and not verdict.cascade:
                return verdict
        if not any(ln and not ln[0].isspace() and EXCEPTION_LINE.match(ln) for ln in plain):
            return None
        tb = last_traceback(text)
        if tb is None or not tb.uncaught:
            return None
        ev = RankEvidence(local_rank=local, rank=rank, message=tb.exception,
                          callstack=tb.callstack, sources=["live-stderr"])  # fmt: skip
        verdict = classify_rank(ev)
        if verdict.kind in STOP_KINDS and not verdict.cascade:
            return verdict
        return None


class ReportWatch:
    """Reads the job-side report as it grows; returns the first mismatching verdict."""

    def __init__(self, path: Path, expected: int | None, every_s: float = 0.1) -> None:
        self.path, self.expected, self.every_s = path, expected, every_s
        self._next = 0.0
        self._tail = _Tail()
        self.records: list[ReportRecord] = []

    def poll(self) -> BatchCheck | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.every_s
        new = self._tail.read(self.path)
        for line in new:
            try:
                self.records.append(parse_record(json.loads(line)))
            except ValueError:
                continue  # the reader after the attempt lists it as a problem
        if not new:
            return None
        check = check_batch(self.records, self.expected)
        return check if check.status == "mismatch" else None
