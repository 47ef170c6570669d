"""ZeRO-1/2 data parallelism and optimizer offload for a reference run, measured as rank 0.

Why it exists: the memory model shards optimizer states (ZeRO-1) and gradients (ZeRO-2) over the
data-parallel group and moves the optimizer to host memory under offload; those savings are only
trusted once they are measured. This wraps AdamW so that rank 0 of a ``dp``-rank job holds
exactly what it would hold in a real job.

Sharding mirrors Megatron's distributed optimizer and DeepSpeed stages 1-2: the parameters,
concatenated in model order, are cut into ``dp`` contiguous element ranges (rank r holds
``total // dp`` plus one of the remainder, as ``dssup.memory.zero.shard_sizes``), and rank 0
owns the first. The optimizer steps only the owned slices, which are views of the parameters.

- ZeRO-0/1: backward produces full gradients; they are all-reduced in place (for ZeRO-1 this
  stands for the reduce-scatter into the same buffer) and the owned slices are views of them.
- ZeRO-2: each gradient is reduced as soon as it is accumulated (post-accumulate-grad hook); the
  owned slice is copied out and the full gradient freed, so full gradients never pile up.
- Offload: the owned slices have host copies (the master) and host Adam moments; gradients are
  copied to the host after reduction and freed on the device, which keeps parameters, gradients
  until they are copied, and activations.

Stand-ins, because the real thing cannot exist on a one-process CPU machine: the data-parallel
group is torch's fake process group (collectives are no-ops; every collective here works in
place on buffers that exist anyway, so no allocation is skipped), and the host is the ``meta``
device (sizes without storage, which MemTracker counts apart from the CPU that plays the
accelerator). A meta master has no values, so the in-place copy of the updated master back into
the parameter (no allocation) is skipped. AdamW keeps its step count as a 4-byte CPU scalar per
slice whatever the device, so those few bytes stay on the accelerator here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["HOST", "ShardedAdamW", "fake_world", "owned_slices"]

HOST = torch.device("meta")


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """Be rank 0 of a ``world_size``-rank fake process group for the duration of the block."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # test-only module

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class Slice:
    """Elements ``[start, stop)`` of ``param`` (flattened) owned by this rank."""

    param: nn.Parameter
    start: int
    stop: int


def owned_slices(params: list[nn.Parameter], rank: int, world: int) -> list[Slice]:
    """The slices of ``params`` that fall into ``rank``'s range of the concatenated elements."""
    total = sum(p.numel() for p in params)
    q, r = divmod(total, world)
    lo = rank * q + min(rank, r)
    hi = lo + q + (1 if rank < r else 0)
    out, offset = [], 0
    for p in params:
        a, b = max(lo, offset), min(hi, offset + p.numel())
        if a < b:
            out.append(Slice(p, a - offset, b - offset))
        offset += p.numel()
    return out


def _flat(t: torch.Tensor, s: Slice) -> torch.Tensor:
    return t.detach().view(-1)[s.start : s.stop]


class ShardedAdamW:
    """AdamW over rank 0's slices under ZeRO ``stage`` (0-2), optionally offloaded to the host.

    ``zero_grad``/``step`` replace the optimizer's; ``inner`` is the AdamW that owns the states
    (for MemTracker and the profiler cross-check)."""

    def __init__(
        self,
        model: nn.Module,
        stage: int,
        offload: bool,
        optimizer_kwargs: dict[str, bool],
    ) -> None:
        if stage not in (0, 1, 2):
            raise ValueError(f"ZeRO stage {stage} is not implemented by the reference harness")
        params = [p for p in model.parameters() if p.requires_grad]
        self.params, self.stage, self.offload = params, stage, offload
        self.reduce = dist.is_initialized()  # gradients are all-reduced under ZeRO-0 too
        world = dist.get_world_size() if self.reduce and stage else 1
        self.slices = owned_slices(params, dist.get_rank() if world > 1 else 0, world)
        self.shards = [
            _flat(s.param, s).to(HOST) if offload else _flat(s.param, s) for s in self.slices
        ]
        self.inner = torch.optim.AdamW(self.shards, lr=1e-4, **optimizer_kwargs)  # type: ignore[arg-type]
        if stage == 2:
            for p in params:
                p.register_post_accumulate_grad_hook(self._reduce_one)  # type: ignore[no-untyped-call]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free every gradient, on the device and on the host (always ``set_to_none``)."""
        for t in [*self.params, *self.shards]:
            t.grad = None

    def _take(self, i: int) -> None:
        """Give shard ``i`` its gradient: a view of the full gradient, or a copy (ZeRO-2, host)."""
        s = self.slices[i]
        assert s.param.grad is not None  # every parameter takes part in the loss
        g = _flat(s.param.grad, s)
        self.shards[i].grad = g.to(HOST) if self.offload else (g.clone() if self.stage == 2 else g)

    def _reduce_one(self, p: torch.Tensor) -> None:
        """ZeRO-2 hook: reduce ``p``'s gradient, keep the owned slice, free the rest."""
        assert p.grad is not None
        if self.reduce:
            dist.all_reduce(p.grad)  # stands for the reduce-scatter into the owners' partitions
        for i, s in enumerate(self.slices):
            if s.param is p:
                self._take(i)
        p.grad = None

    def step(self) -> None:
        """Reduce (ZeRO-0/1), hand the owned gradients to the optimizer and step it."""
        if self.stage < 2:
            for p in self.params:
                if p.grad is not None and self.reduce:
                    dist.all_reduce(p.grad)
            for i in range(len(self.slices)):
                self._take(i)
            if self.offload:  # the device copies are no longer needed
                for p in self.params:
                    p.grad = None
        self.inner.step()
