"""When two groups wrote one checkpoint directory: keep their checkpoints out of every resume.

A split brain (one job forming two smaller torchrun groups, e.g. after rendezvous timeouts that
were too short) is detected from the nodes' reports: a group smaller than the node set that was
decided. Both groups may have saved "complete" checkpoints that interleave steps of two
different trajectories; none of them can be trusted. Everything the checkpoint directory
gained since the generation started is moved to ``<shared>/quarantine/<time>/`` (kept for a
person to inspect, never deleted), so the next generation resumes from the last checkpoint
written before the split.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

__all__ = ["quarantine_since"]

log = logging.getLogger(__name__)


def quarantine_since(checkpoint_dir: Path | None, since: float, shared_dir: Path) -> list[str]:
    """Move entries of ``checkpoint_dir`` modified at or after ``since`` (epoch seconds)."""
    if checkpoint_dir is None or not checkpoint_dir.is_dir():
        return []
    target = shared_dir / "quarantine" / time.strftime("%Y%m%dT%H%M%S")
    moved = []
    for entry in sorted(checkpoint_dir.iterdir()):
        try:
            fresh = entry.stat().st_mtime >= since
        except FileNotFoundError:
            continue
        if fresh:
            target.mkdir(parents=True, exist_ok=True)
            shutil.move(str(entry), str(target / entry.name))
            moved.append(entry.name)
    if moved:
        log.warning("split brain: quarantined %s into %s", moved, target)
    return moved
