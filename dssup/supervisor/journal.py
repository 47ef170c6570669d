"""The run journal: every attempt, failure, decision and outcome, in ``<run-dir>/journal.jsonl``.

It is the supervisor's memory. Writes are atomic: the whole file is rewritten to a temporary
file in the same directory, fsynced and renamed over the old one, so a reader (or a supervisor
restarted after SIGKILL) sees either the journal before an event or after it, never half a
line. Journals are small (a few records per attempt), so rewriting costs microseconds.

Record types: ``run-started``, ``attempt-started``, ``attempt-ended``, ``job-report`` (what
the job itself reported about an attempt, and the global-batch verdict), ``continuity`` (an
adapter's judgement of an ended attempt), ``decision``, ``supervisor-restarted``, ``run-ended``.
Each carries ``seq`` (0, 1, ...) and ``ts``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from dssup.errors import JournalError

__all__ = ["Journal"]

FILENAME = "journal.jsonl"


class Journal:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / FILENAME
        self.records: list[dict[str, Any]] = self._read() if self.path.exists() else []

    def _read(self) -> list[dict[str, Any]]:
        records = []
        for n, line in enumerate(self.path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise JournalError(f"{self.path}:{n}: not JSON ({exc})") from exc
        return records

    def append(self, type_: str, **fields: Any) -> dict[str, Any]:
        record = {"seq": len(self.records), "ts": round(time.time(), 3), "type": type_, **fields}
        lines = [json.dumps(r, sort_keys=True, default=str) for r in [*self.records, record]]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".journal.")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write("\n".join(lines) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.records.append(record)
        return record

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == type_]

    def first(self, type_: str) -> dict[str, Any] | None:
        found = self.of_type(type_)
        return dict(found[0]) if found else None

    def last(self, type_: str) -> dict[str, Any] | None:
        found = self.of_type(type_)
        return found[-1] if found else None

    @property
    def started(self) -> bool:
        return self.first("run-started") is not None

    @property
    def ended(self) -> bool:
        return self.last("run-ended") is not None

    def open_attempt(self) -> dict[str, Any] | None:
        """An ``attempt-started`` with no ``attempt-ended``: the supervisor died during it."""
        ended = {r["attempt"] for r in self.of_type("attempt-ended")}
        for rec in reversed(self.of_type("attempt-started")):
            if rec["attempt"] not in ended:
                return dict(rec)
        return None

    def next_attempt(self) -> int:
        started = self.of_type("attempt-started")
        return (started[-1]["attempt"] + 1) if started else 1
