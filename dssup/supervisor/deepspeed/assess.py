"""Judge a finished attempt that resumed under a changed config: did the loss continue?

Reads what the run directory already holds (no torch): each attempt's console log
(``attempt-NNN/torchrun.log``: the script's ``DSSUP_DS`` step lines, or ``step N ... loss X``
lines), and what ``adapter.apply`` recorded for the attempt (``ds_resume.json``: the
checkpoint's step and samples; ``ds_config.json``: the global batch). The losses of every
earlier attempt form the curve before the failure (a later attempt's value wins for a step run
twice). The record is written next to the attempt (``ds_continuity.json``) and returned for the
journal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dssup.supervisor.deepspeed.continuity import (
    ContinuityRecord,
    LossPoint,
    check_continuity,
    parse_loss_lines,
)

__all__ = ["assess_attempt", "attempt_losses"]

_ATTEMPT = re.compile(r"attempt-(\d+)$")
LOG_NAME = "torchrun.log"


def attempt_losses(attempt_dir: Path) -> list[LossPoint]:
    log = attempt_dir / LOG_NAME
    return parse_loss_lines(log.read_text(errors="replace")) if log.is_file() else []


def _attempts_before(attempt_dir: Path) -> list[Path]:
    m = _ATTEMPT.search(attempt_dir.name)
    if m is None:
        return []
    number = int(m.group(1))
    found = []
    for p in attempt_dir.parent.iterdir():
        if (n := _ATTEMPT.search(p.name)) is not None and int(n.group(1)) < number:
            found.append((int(n.group(1)), p))
    return [p for _, p in sorted(found)]


def assess_attempt(attempt_dir: Path, **tolerances: float) -> ContinuityRecord | None:
    """The continuity record of an attempt that resumed from a checkpoint and ran at least one
    step; None otherwise."""
    resume_file = attempt_dir / "ds_resume.json"
    if not resume_file.is_file():
        return None
    resume = json.loads(resume_file.read_text())
    if resume.get("kind") in (None, "none"):
        return None
    before: dict[int, LossPoint] = {}
    for prev in _attempts_before(attempt_dir):
        before |= {p.step: p for p in attempt_losses(prev)}
    after = attempt_losses(attempt_dir)
    if not after:
        return None  # the attempt died before a new step: nothing to judge (its failure is)
    config_file = attempt_dir / "ds_config.json"
    batch = (
        json.loads(config_file.read_text()).get("train_batch_size")
        if config_file.is_file()
        else None
    )
    record = check_continuity(
        list(before.values()),
        after,
        int(resume.get("global_steps", 0)),
        checkpoint_samples=resume.get("global_samples"),
        global_batch=batch if isinstance(batch, int) else None,
        **tolerances,  # type: ignore[arg-type]
    )
    (attempt_dir / "ds_continuity.json").write_text(record.model_dump_json(indent=1))
    return record
