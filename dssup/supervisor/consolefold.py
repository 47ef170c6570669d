"""The launcher's own traceback on the console, folded to one line per failure.

When a worker fails, torchrun (and accelerate, which runs torchrun in-process) raises
``ChildFailedError`` and prints its own 20-line traceback plus a failure table; accelerate's
single-process launcher raises ``CalledProcessError``. That text says nothing the worker's
traceback and dssup's verdict do not, and it buries them. On the console dssup folds each such
block into one line naming the failed ranks and exit codes; the full text stays in the
attempt's ``torchrun.log``. Worker output (prefixed ``[defaultN]:``/``[rankN]:``) and
tracebacks that end in any other exception pass through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from dssup.supervisor.evidence import parse_failure_table
from dssup.supervisor.tracebacks import EXCEPTION_LINE

__all__ = ["LauncherTracebackFold"]

_WORKER = re.compile(r"^\[(?:default|rank)\d+\]:")
_LAUNCHER_EXCEPTIONS = ("ChildFailedError", "CalledProcessError")
_RULE = re.compile(r"^=+$")


class LauncherTracebackFold:
    """A console sink wrapper: call it with each line; ``flush()`` at the end."""

    def __init__(self, sink: Callable[[str], None], full_text: Path) -> None:
        self.sink, self.full_text = sink, full_text
        self._held: list[str] = []
        self._table = False  # inside the failure table after ChildFailedError
        self._rules = 0

    def __call__(self, line: str) -> None:
        if self._table:
            self._held.append(line)
            if _RULE.match(line.strip()):
                self._rules += 1
                if self._rules >= 2:
                    self._fold()
            return
        if not self._held:
            if line.strip() == "Traceback (most recent call last):" and not _WORKER.match(line):
                self._held.append(line)
            else:
                self.sink(line)
            return
        self._held.append(line)
        if _WORKER.match(line) or line[:1].isspace() or not line.strip():
            return
        m = EXCEPTION_LINE.match(line.strip())
        if m is None:
            return
        if any(name in m.group(1).split(":")[0] for name in _LAUNCHER_EXCEPTIONS):
            if "ChildFailedError" in line:
                self._table, self._rules = True, 0
            else:
                self._fold()
        else:
            self._release()

    def _release(self) -> None:
        for held in self._held:
            self.sink(held)
        self._held = []

    def _fold(self) -> None:
        text = "\n".join(self._held)
        rows = parse_failure_table(text)
        exception = next((ln.strip() for ln in self._held if EXCEPTION_LINE.match(ln.strip())), "")
        kind = exception.split(":")[0].rsplit(".", 1)[-1]
        what = ", ".join(f"rank {r['rank']} exit {r['exit_code']}" for r in rows) or exception
        self.sink(f"dssup: the launcher's {kind} ({what}) folded; full text in {self.full_text}")
        self._held, self._table, self._rules = [], False, 0

    def flush(self) -> None:
        if self._held:
            self._release()
        self._table = False
