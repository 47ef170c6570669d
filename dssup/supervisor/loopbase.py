"""What every part of the supervisor's loop shares: its fields and three small helpers.

The loop is split by concern so that each part reads on its own: ``supervisor.py`` decides
(start or continue the run, classify the outcome, choose a remedy, end the run),
``attempt_cycle.py`` runs one attempt and records what happened. Both are mixins of
``Supervisor`` over this base, so a subclass (the multi-node supervisor) overrides any step by
its old name.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dssup.obs.metrics import Metrics, NullMetrics
from dssup.supervisor.adapters import PlanAdapter
from dssup.supervisor.checkpoints import find_latest
from dssup.supervisor.command import LaunchCommand
from dssup.supervisor.config import SupervisorConfig
from dssup.supervisor.jobview import JobView
from dssup.supervisor.process import Child
from dssup.supervisor.remedies import RemedyPlanner

__all__ = ["SupervisorBase"]

log = logging.getLogger(__name__)


@dataclass
class SupervisorBase:
    config: SupervisorConfig
    command: LaunchCommand
    planner: RemedyPlanner
    adapters: Sequence[PlanAdapter] = ()
    metrics: Metrics = field(default_factory=NullMetrics)
    sink: Callable[[str], None] | None = None
    sleep: Callable[[float], None] = time.sleep
    view: JobView | None = None  # the hand-off and framework of this script (None: builtin)
    say: Callable[[str], None] | None = None  # dssup's own lines for the console
    _signal: int | None = None
    _child: Child | None = None

    def _say(self, text: str) -> None:
        log.debug("%s", text)
        if self.say is not None:
            self.say(f"dssup: {text}")

    # --- signals -------------------------------------------------------------------------
    def request_stop(self, sig: int) -> None:
        """Called from a signal handler: forward once torchrun runs, never relaunch."""
        self._signal = sig

    def _install(self) -> dict[int, Any]:
        old: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: the caller forwards
                old[sig] = signal.signal(sig, lambda s, _f: self.request_stop(s))
        return old

    def _step(self) -> int | None:
        """The step of the latest complete checkpoint, if any."""
        ref = find_latest(self.config.checkpoint_dir, self.config.checkpoint_pattern)
        return ref.step if ref else None

    def _write_metrics(self) -> None:
        path, write = self.config.metrics_textfile, getattr(self.metrics, "write_textfile", None)
        if path is not None and write is not None:
            write(path)
