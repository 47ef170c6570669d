"""Every rank's verdict on a step, exchanged on a side channel with a bounded wait.

After its micro-batches each rank puts one code in its own slot of a world-sized integer
vector (0: fine, else what went wrong and where) and the vector is summed over a separate gloo
group created for the guard alone. Every rank then holds the same vector and takes the same
decision from it: the OOMing rank and the ranks that did not OOM can never disagree. The side
group carries nothing but these verdicts, so it is never entangled with the training's own
collectives (DDP's gradient all-reduce, FSDP's all-gathers, NCCL streams).

The wait is bounded (the watchdog): ``exchange`` waits at most ``timeout_s`` for every rank's
verdict (``Work.wait(timeout)``, which gloo honours) and raises ``VerdictTimeout`` when a rank
never comes (it is stuck in a collective a failed peer will never join), or ``PeerLost`` when
the exchange itself fails (a peer died: gloo reports the closed connection at once). Either
way in-process recovery is over; the guard's backstop takes over.
"""

from __future__ import annotations

import datetime
from enum import IntEnum
from typing import Any

__all__ = ["Agreement", "Code", "PeerLost", "VerdictTimeout"]


class Code(IntEnum):
    """One rank's verdict on its micro-batches."""

    OK = 0
    OOM_FORWARD = 1
    OOM_BACKWARD = 2
    ERROR = 3  # a non-OOM exception: this rank re-raises it, its peers give up

    @property
    def phase(self) -> str:
        return {1: "forward", 2: "backward"}.get(int(self), "")


class VerdictTimeout(RuntimeError):
    """Not every rank gave its verdict within the watchdog's bound."""


class PeerLost(RuntimeError):
    """The verdict exchange failed: a peer is gone."""


class Agreement:
    """The side channel. ``group`` None means a single process: the verdict is one's own."""

    def __init__(self, group: Any, rank: int, world: int) -> None:
        self.group, self.rank, self.world = group, rank, world

    @classmethod
    def create(cls) -> Agreement:
        """Collective when distributed: every rank must call it at the same point."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return cls(None, 0, 1)
        group = dist.new_group(backend="gloo")
        return cls(group, dist.get_rank(), dist.get_world_size())

    def exchange(self, code: Code, timeout_s: float) -> tuple[Code, ...]:
        """Every rank's code, in rank order. Raises ``VerdictTimeout`` or ``PeerLost``."""
        if self.group is None:
            return (code,)
        import torch
        import torch.distributed as dist

        vector = torch.zeros(self.world, dtype=torch.int32)
        vector[self.rank] = int(code)
        try:
            work = dist.all_reduce(vector, group=self.group, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except (RuntimeError, MemoryError) as exc:
            if "timed out" in str(exc).lower():
                raise VerdictTimeout(
                    f"not every rank gave its verdict within {timeout_s:.1f} s"
                ) from exc
            raise PeerLost(f"the verdict exchange failed: {str(exc).strip()[:300]}") from exc
        return tuple(Code(int(v)) for v in vector.tolist())
