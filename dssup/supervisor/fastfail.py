"""Fast fail: stop an attempt as soon as one rank's error file names a root cause.

torchrun's own teardown after a rank fails takes seconds (the failing process unwinds, torchrun
notices, stops the healthy ranks with SIGTERM and a grace period, shuts its store down); on
GPUs, healthy ranks blocked in a collective can take much longer. The failing rank's
``error.json`` is written by ``@record`` before any of that, so dssup watches for it while the
attempt runs. When it names a root cause that restarting the same plan cannot fix (an OOM, a
user error) and is not a cascade, dssup kills the attempt's processes at once (SIGKILL, by
token) and goes on to classify and relaunch. Checkpoints cut short this way are incomplete and
never resumed from.
"""

from __future__ import annotations

import time
from pathlib import Path

from dssup.supervisor.classify import classify_rank
from dssup.supervisor.evidence import RankEvidence, read_error_file
from dssup.supervisor.launchers.base import RankLogSource
from dssup.supervisor.launchers.torchrun import TORCHRUN
from dssup.supervisor.models import FailureKind, RankFailure

__all__ = ["STOP_KINDS", "ErrorFileWatch"]

STOP_KINDS = frozenset(
    {
        FailureKind.CUDA_OOM,
        FailureKind.HOST_OOM,
        FailureKind.LOAD_OOM,
        FailureKind.COMM_OOM,
        FailureKind.USER_ERROR,
    }
)


class ErrorFileWatch:
    """Polls ``<log_dir>/*/attempt_*/<rank>/error.json`` written since ``since``."""

    def __init__(
        self, log_dir: Path, since: float, every_s: float = 0.1, launcher: RankLogSource = TORCHRUN
    ) -> None:
        self.log_dir, self.since, self.every_s, self.launcher = log_dir, since, every_s, launcher
        self._next = 0.0
        self._seen: set[Path] = set()

    def poll(self) -> RankFailure | None:
        """A root-cause failure that stops the attempt, or None (also between polls)."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.every_s
        for local, files in sorted(self.launcher.rank_logs(self.log_dir).items()):
            path = files.error_file
            if path is None or path in self._seen or not path.is_file():
                continue
            try:
                if path.stat().st_mtime < self.since:
                    self._seen.add(path)
                    continue
            except OSError:
                continue
            doc = read_error_file(path)
            if doc is None:
                continue  # absent or half-written: look again next poll
            self._seen.add(path)
            ev = RankEvidence(
                local_rank=local, rank=local, message=str(doc["message"]),
                callstack=str(doc["callstack"]), sources=["error-file"],
            )  # fmt: skip
            verdict = classify_rank(ev)
            if verdict.kind in STOP_KINDS and not verdict.cascade:
                return verdict
        return None
