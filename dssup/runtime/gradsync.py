"""How the step guard keeps the training's own collectives out of a micro-batch that may OOM.

A rank that runs out of memory inside a collective-carrying region leaves its peers blocked in
that collective: DDP's gradient all-reduce fires from autograd hooks during backward, FSDP
all-gathers parameters in forward and reduce-scatters gradients in backward. Composer's
auto-microbatching deadlocks exactly there when only some DDP ranks OOM. So the guard runs
every micro-batch that may still be redone *without* training collectives, and lets gradients
meet only after every rank has said it succeeded:

* ``deferred`` (DDP, or a plain module in a data-parallel job): every micro-batch runs under
  ``no_sync()``; after the verdict the guard all-reduces the accumulated gradients itself
  (through one 25 MiB buffer per dtype, allocated when the guard is built and kept, as DDP
  keeps its buckets; averaged over the group, as DDP does). Every OOM
  in forward or backward is recoverable; the cost is that gradient communication no longer
  overlaps the last backward.
* ``last`` (DDP on request, FSDP2 always): all micro-batches but the last run without
  communication (FSDP2: the parameters are gathered once before them with ``unshard()`` and
  kept gathered until the last backward, so a guarded FSDP2 step holds whole parameters like
  ZeRO-2, and ``set_requires_gradient_sync(False)``); the verdict comes before the last one,
  whose backward synchronises as usual (overlapped). An OOM in that last micro-batch cannot be
  redone: its peers may already wait in the collective, so the guard gives up at once and the
  supervisor restarts the job. With one micro-batch per step nothing is recoverable in-process.
* ``local``: a single process, or a job that synchronises gradients itself.

A DeepSpeed engine is refused: ZeRO-2 reduces gradient partitions inside every micro-batch's
backward and ZeRO-3 gathers parameters in every forward, both from DeepSpeed's own hooks, and
DeepSpeed offers no public way to undo a partly reduced micro-batch or a half-filled bucket;
``dssup run``'s restart path (with its ZeRO and offload rungs) covers DeepSpeed jobs.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

from dssup.errors import ConfigError

__all__ = ["BUCKET_BYTES", "GradSync", "choose_sync"]

BUCKET_BYTES = 25 << 20  # DDP's default bucket size


class GradSync:
    """The ``local`` strategy; the others override what they need."""

    name = "local"
    overlapped = False  # the last micro-batch synchronises inside its backward
    forward_collectives = False  # every forward communicates: agree after every micro-batch

    def prepare(self) -> None:
        """Before the micro-batches of one try (may be collective: every rank calls it)."""

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Around a micro-batch that must not communicate."""
        yield

    @contextlib.contextmanager
    def syncing(self) -> Iterator[None]:
        """Around the micro-batch whose backward synchronises (``overlapped`` only)."""
        yield

    def reduce(self, timeout_s: float) -> None:
        """After every rank's verdict was OK: make the gradients global (``deferred`` only)."""


class DeferredSync(GradSync):
    name = "deferred"

    def __init__(self, model: Any, group: Any) -> None:
        import torch
        import torch.distributed as dist

        self.model, self.group = model, group
        self.world = dist.get_world_size(group)
        self.no_sync = getattr(model, "no_sync", None)
        will_sync = getattr(model, "will_sync_module_buffers", None)
        self.forward_collectives = bool(will_sync and will_sync())
        self.params = [p for p in model.parameters() if p.requires_grad]
        # One communication buffer per dtype and device, allocated now and kept, as DDP keeps
        # its buckets: the gradient sync after an OOM never has to allocate.
        self.buffers: dict[tuple[Any, Any], Any] = {}
        for kind in {_kind(p) for p in self.params}:
            numels = [p.numel() for p in self.params if _kind(p) == kind]
            per_bucket = BUCKET_BYTES // torch.empty((), dtype=kind[0]).element_size()
            size = min(sum(numels), max(per_bucket, *numels))
            self.buffers[kind] = torch.empty(size, dtype=kind[0], device=kind[1])

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        with self.no_sync() if self.no_sync is not None else contextlib.nullcontext():
            yield

    def reduce(self, timeout_s: float) -> None:
        import torch

        # Which parameters have a gradient on any rank (DDP's find_unused_parameters rule).
        present = torch.tensor([float(p.grad is not None) for p in self.params])
        self._all_reduce(present, timeout_s)
        used = [p for p, n in zip(self.params, present.tolist(), strict=True) if n > 0]
        for bucket in _buckets(used, self.buffers):
            flat = self.buffers[_kind(bucket[0])]
            offset = 0
            for p in bucket:
                view = flat.narrow(0, offset, p.numel())
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad.reshape(-1))
                offset += p.numel()
            self._all_reduce(flat.narrow(0, 0, offset), timeout_s)
            flat.narrow(0, 0, offset).div_(self.world)
            offset = 0
            for p in bucket:
                view = flat.narrow(0, offset, p.numel()).view_as(p)
                if p.grad is None:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)
                offset += p.numel()

    def _all_reduce(self, tensor: Any, timeout_s: float) -> None:
        import torch.distributed as dist

        work = dist.all_reduce(tensor, group=self.group, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))


class DDPLastSync(GradSync):
    name = "last"
    overlapped = True

    def __init__(self, model: Any) -> None:
        self.model = model
        self.forward_collectives = bool(model.will_sync_module_buffers())

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        with self.model.no_sync():
            yield


class FSDP2Sync(GradSync):
    name = "last"
    overlapped = True

    def __init__(self, model: Any) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.model = model
        self.units = [m for m in model.modules() if isinstance(m, FSDPModule)]

    def prepare(self) -> None:
        self.model.set_requires_gradient_sync(False)
        self.model.set_reshard_after_forward(False)
        self.model.set_reshard_after_backward(False)
        for unit in self.units:  # gather every parameter once, before any micro-batch
            unit.unshard()

    @contextlib.contextmanager
    def syncing(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(True)
        self.model.set_reshard_after_backward(True)
        yield


def _buckets(params: list[Any], buffers: dict[tuple[Any, Any], Any]) -> Iterator[list[Any]]:
    """Consecutive parameters of one dtype and device that fit their kind's buffer."""
    bucket: list[Any] = []
    size = 0
    for p in params:
        room = buffers[_kind(p)].numel()
        if bucket and (size + p.numel() > room or _kind(p) != _kind(bucket[0])):
            yield bucket
            bucket, size = [], 0
        bucket.append(p)
        size += p.numel()
    if bucket:
        yield bucket


def _kind(p: Any) -> tuple[Any, Any]:
    return (p.dtype, p.device)


def choose_sync(model: Any, sync: str) -> GradSync:
    """The strategy for ``model`` (``sync``: auto, deferred, last or local)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if hasattr(model, "zero_optimization_stage"):
        raise ConfigError(
            "model", "a DeepSpeed engine cannot be guarded in-process (its ZeRO hooks "
            "communicate inside every micro-batch and cannot be undone)",
            "run it under `dssup run` without the guard: the restart path recovers it",
        )  # fmt: skip
    if sync not in {"auto", "deferred", "last", "local"}:
        raise ConfigError("sync", f"unknown value {sync!r}", "use auto, deferred, last or local")
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if sync == "local" or not distributed:
        return GradSync()
    if isinstance(model, FSDPModule):
        if sync == "deferred":
            raise ConfigError(
                "sync", "FSDP2 offers no public way to reduce gradients outside a backward",
                "use sync='last' (or 'auto')",
            )  # fmt: skip
        return FSDP2Sync(model)
    if isinstance(model, DistributedDataParallel):
        if sync == "last":
            return DDPLastSync(model)
        return DeferredSync(model, model.process_group)
    if sync == "deferred":
        return DeferredSync(model, None)
    raise ConfigError(
        "model", f"a plain {type(model).__name__} in a {dist.get_world_size()}-rank job",
        "wrap it in DistributedDataParallel or fully_shard, or pass sync='deferred' (the guard "
        "averages gradients over all ranks) or sync='local' (you synchronise them yourself)",
    )  # fmt: skip
