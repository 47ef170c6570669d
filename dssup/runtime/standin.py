"""A CPU worker that runs out of memory like a GPU whose size is set by what the job holds.

``memory_cap(budget)`` turns a CPU worker into a device of ``budget`` bytes above its current
size. A budget in MiB measured once on one machine is a poor device, though: another machine's
kernels, allocator and libraries (their buffers on first use, their workspaces) move a job's
need by a few MiB, and an OOM placed 5 MiB from a need then lands elsewhere or not at all.

``DeviceStandIn`` sizes the device from the job itself instead. ``start()`` is called where a
fixed cap would go (after the libraries' first use, e.g. after a dry micro-batch): it notes the
size there as the device's base, or, when an earlier attempt already found the device's size
(``budget_file``), caps at this process's base plus that budget. ``fill()`` is called at a named
point of the step that must fail (the logits of micro-batch 16 exist; its backward starts): the
cap goes to the current size plus ``slack_bytes``, so the next large allocation of that
micro-batch fails in torch's own allocator, on any machine, and the budget found (what the
process holds there above its base) is written for the attempts after this one; a rank that
the job's end stopped before its named point takes its peers' budget. A micro-batch half as big
holds about
half as much at that point, so it fits the same device: the recovery a test expects, without a
number that belongs to one machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dssup.runtime.process import free_heap_bytes, memory_cap, trimmed_size_bytes

__all__ = ["DeviceStandIn"]

SLACK_BYTES = 1 << 20  # room for the small allocations between the named point and the failure


class DeviceStandIn:
    """See the module docstring. ``budget_file`` may name ``{rank}``; None keeps no record."""

    def __init__(self, budget_file: str | Path | None = None, slack_bytes: int = SLACK_BYTES):
        rank = os.environ.get("RANK", "0")
        self.template = str(budget_file) if budget_file else None
        self.path = Path(self.template.format(rank=rank)) if self.template else None
        self.slack = slack_bytes
        self.base: int | None = None
        self.limit: int | None = None
        self.pending = False  # started without a recorded budget, not yet filled
        self._due = False  # with watch(): start at the next forward
        self.base_live = 0  # the base less the free heap glibc keeps mapped

    def recorded_budget(self) -> int | None:
        """The budget an earlier attempt found for this rank; when it found none for this rank
        but did for others (``{rank}`` in the file name), the largest of theirs; else None.

        A rank need not reach the named point before the attempt ends: when another rank's
        OOM stops the job first (dssup stops every rank at the first failure), this rank kept
        no budget, and sizing its device anew in the next attempt would size it at that
        attempt's smaller micro-batch. Its peers' devices are what the failing step held."""
        if self.path is None:
            return None
        if self.path.exists():
            return int(json.loads(self.path.read_text())["budget_bytes"])
        if self.template is None or "{rank}" not in self.template:
            return None
        peers = Path(self.template).parent.glob(Path(self.template).name.replace("{rank}", "*"))
        found = [
            int(json.loads(f.read_text())["budget_bytes"]) for f in peers if f.suffix == ".json"
        ]
        return max(found, default=None)

    def start(self) -> int | None:
        """Cap at the recorded budget when there is one (returns the limit), else remember the
        current size as the base that ``fill`` measures from and wait for it (returns None)."""
        budget = self.recorded_budget()
        if budget is not None:
            self.limit = memory_cap(budget)
            self.base = self.limit - budget
            return self.limit
        self.base, self.pending = trimmed_size_bytes(), True
        self.base_live = self.base - free_heap_bytes()
        return None

    def fill(self) -> int:
        """Cap at the current size plus the slack and record the budget; returns the limit.
        The budget recorded is what the process holds now above what it held at ``start``,
        both less the free heap glibc keeps mapped (``free_heap_bytes``: a step that reuses a
        hole left by an earlier step's buffers grows the address space by less than it
        holds), plus the slack."""
        if self.base is None:
            raise RuntimeError("DeviceStandIn.fill() before start()")
        self.limit, self.pending = memory_cap(self.slack, collect=False), False
        live = self.limit - self.slack - free_heap_bytes()
        budget = live + self.slack - self.base_live
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            doc = {"budget_bytes": budget, "base_bytes": self.base, "limit_bytes": self.limit,
                   "held_bytes": live - self.base_live}  # fmt: skip
            partial = self.path.with_name(self.path.name + ".partial")
            partial.write_text(json.dumps(doc))
            os.replace(partial, self.path)  # atomic: a later attempt reads all of it or nothing
        return self.limit

    def watch(self, model: Any, output: Any) -> None:
        """Hooks for a training loop the caller does not own (a Trainer): after ``begin()``, the
        next forward of ``model`` starts the device (the base is measured right before it, when
        the previous step and its checkpoint are done with), and the first output of
        ``output`` (e.g. the model's output embeddings) while pending fills it. Both hooks
        return None: inputs and outputs stay what they were."""

        def before(*_: Any) -> None:
            if self._due:
                self._due = False
                self.start()

        def after(*_: Any) -> None:
            if self.pending:
                self.fill()

        model.register_forward_pre_hook(before)
        output.register_forward_hook(after)

    def begin(self) -> None:
        """With ``watch``: start the device at the next forward of the model."""
        self._due = True
