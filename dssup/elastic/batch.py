"""Integer arithmetic of an elastic job: node ranges, world sizes, DP sizes, batch splits.

DeepSpeed's elasticity picks a global batch that many GPU counts divide (840 instead of the
user's 1024). dssup goes the other way: the user's global batch is fixed, and this module says
which world sizes can keep it exactly (``micro x accumulation x DP == global batch``) and with
which (micro-batch, accumulation) pairs. No memory here; ``solver.py`` adds that.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dssup.errors import ConfigError

__all__ = ["NodeRange", "Split", "divisors", "dp_size", "splits", "world_sizes"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_RANGE = re.compile(r"^\s*(\d+)\s*(?::\s*(\d+)\s*)?$")


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending (O(sqrt n))."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


class NodeRange(BaseModel):
    """torchrun's ``--nnodes MIN:MAX`` (or a single ``N``, meaning ``N:N``)."""

    model_config = _FROZEN
    min_nodes: int = Field(ge=1, description="fewest nodes the job may run on")
    max_nodes: int = Field(ge=1, description="most nodes the job may run on")

    @model_validator(mode="after")
    def _order(self) -> NodeRange:
        if self.min_nodes > self.max_nodes:
            raise ConfigError(
                "nnodes",
                f"MIN {self.min_nodes} is larger than MAX {self.max_nodes}",
                "write MIN:MAX with MIN <= MAX, e.g. 4:16",
            )
        return self

    @classmethod
    def parse(cls, text: str) -> NodeRange:
        """``"4:16"`` or ``"8"``; a ``ConfigError`` naming ``--nnodes`` otherwise."""
        match = _RANGE.match(text)
        if not match:
            raise ConfigError("nnodes", f"cannot read {text!r}", "write N or MIN:MAX, e.g. 4:16")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if low < 1:
            raise ConfigError("nnodes", f"{text!r} has zero nodes", "use at least 1 node")
        if low > high:
            raise ConfigError("nnodes", f"MIN {low} is larger than MAX {high}", "write MIN <= MAX")
        return cls(min_nodes=low, max_nodes=high)

    @property
    def elastic(self) -> bool:
        return self.min_nodes != self.max_nodes

    def nodes(self) -> range:
        return range(self.min_nodes, self.max_nodes + 1)

    def __str__(self) -> str:
        return f"{self.min_nodes}:{self.max_nodes}" if self.elastic else str(self.min_nodes)


class Split(BaseModel):
    """One way to cut a rank's share of the global batch: ``micro_batch x grad_accum``."""

    model_config = _FROZEN
    micro_batch: int = Field(ge=1, description="sequences per micro-batch per DP rank")
    grad_accum: int = Field(ge=1, description="micro-batches per optimizer step")


def world_sizes(nodes: NodeRange, nproc_per_node: int) -> list[int]:
    """Every world size the node range allows: ``n x nproc`` for n in MIN..MAX."""
    return [n * nproc_per_node for n in nodes.nodes()]


def dp_size(world_size: int, model_parallel: int = 1) -> int | None:
    """DP ranks for ``world_size`` GPUs when each replica spans ``model_parallel`` GPUs
    (TP x PP x CP); None when the world is not a multiple of it."""
    if world_size % model_parallel:
        return None
    return world_size // model_parallel


def splits(
    global_batch: int,
    dp: int,
    micro_batches: tuple[int, ...] | None = None,
    max_micro_batch: int | None = None,
) -> list[Split]:
    """Every (micro-batch, accumulation) with ``micro x accum x dp == global_batch``, smallest
    micro-batch first; empty when ``dp`` does not divide the global batch."""
    if dp < 1 or global_batch % dp:
        return []
    share = global_batch // dp
    out = []
    for mb in divisors(share):
        if micro_batches is not None and mb not in micro_batches:
            continue
        if max_micro_batch is not None and mb > max_micro_batch:
            continue
        out.append(Split(micro_batch=mb, grad_accum=share // mb))
    return out
