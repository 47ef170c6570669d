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
micro-batch fails in torch's own allocator, on any machine, and the budget found (the cap less
the base) is written for the attempts after this one. A micro-batch half as big holds about
half as much at that point, so it fits the same device: the recovery a test expects, without a
number that belongs to one machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dssup.runtime.process import memory_cap, trimmed_size_bytes

__all__ = ["DeviceStandIn"]

SLACK_BYTES = 1 << 20  # room for the small allocations between the named point and the failure


class DeviceStandIn:
    """See the module docstring. ``budget_file`` may name ``{rank}``; None keeps no record."""

    def __init__(self, budget_file: str | Path | None = None, slack_bytes: int = SLACK_BYTES):
        rank = os.environ.get("RANK", "0")
        self.path = Path(str(budget_file).format(rank=rank)) if budget_file else None
        self.slack = slack_bytes
        self.base: int | None = None
        self.limit: int | None = None
        self.pending = False  # started without a recorded budget, not yet filled

    def recorded_budget(self) -> int | None:
        """The budget an earlier attempt found, or None."""
        if self.path is None or not self.path.exists():
            return None
        return int(json.loads(self.path.read_text())["budget_bytes"])

    def start(self) -> int | None:
        """Cap at the recorded budget when there is one (returns the limit), else remember the
        current size as the base that ``fill`` measures from and wait for it (returns None)."""
        budget = self.recorded_budget()
        if budget is not None:
            self.limit = memory_cap(budget)
            self.base = self.limit - budget
            return self.limit
        self.base, self.pending = trimmed_size_bytes(), True
        return None

    def fill(self) -> int:
        """Cap at the current size plus the slack and record the budget; returns the limit."""
        if self.base is None:
            raise RuntimeError("DeviceStandIn.fill() before start()")
        self.limit, self.pending = memory_cap(self.slack), False
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            doc = {"budget_bytes": self.limit - self.base, "base_bytes": self.base,
                   "limit_bytes": self.limit}  # fmt: skip
            partial = self.path.with_name(self.path.name + ".partial")
            partial.write_text(json.dumps(doc))
            os.replace(partial, self.path)  # atomic: a later attempt reads all of it or nothing
        return self.limit

    def fill_at_output(self, module: Any) -> Any:
        """Fill the device the first time ``module`` (a torch module, e.g. the model's output
        embeddings) has produced its output while the device is pending; returns the hook's
        handle. The hook returns None: the module's output stays what it was."""

        def hook(*_: Any) -> None:
            if self.pending:
                self.fill()

        return module.register_forward_hook(hook)
