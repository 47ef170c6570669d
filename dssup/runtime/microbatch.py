"""Splitting one rank's share of the global batch into micro-batches, in sample order.

The step guard is handed the whole share of a step (``global_batch / dp`` samples) and cuts it
into ``grad_accum`` contiguous micro-batches of ``micro_batch`` samples. Because the cut keeps
sample order and the loss is weighted by each micro-batch's share of the samples, the summed
gradient does not depend on the split (up to floating-point summation order): a finer split
after an OOM redoes exactly the same global batch.

A batch is a tensor (split along dimension 0), a tuple or list of tensors, a dict of tensors
(a Hugging Face batch), or any other sequence of samples (sliced). Every tensor in one batch
must have the same leading size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dssup.errors import ConfigError

__all__ = ["finer_split", "sample_count", "spans", "take"]


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "narrow")


def _tensors(batch: Any) -> list[Any]:
    if _is_tensor(batch):
        return [batch]
    if isinstance(batch, Mapping):
        return [v for v in batch.values() if _is_tensor(v)]
    if isinstance(batch, (tuple, list)) and batch and all(_is_tensor(v) for v in batch):
        return list(batch)
    return []


def sample_count(batch: Any) -> int:
    """How many samples ``batch`` holds (its leading size); ``ConfigError`` when ambiguous."""
    tensors = _tensors(batch)
    if tensors:
        sizes = {int(t.shape[0]) for t in tensors}
        if len(sizes) != 1:
            raise ConfigError("batch", f"tensors of different leading sizes {sorted(sizes)}")
        return sizes.pop()
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return len(batch)
    raise ConfigError(
        "batch", f"cannot split a {type(batch).__name__}", "pass a tensor, a tuple/list/dict "
        "of tensors with the samples along dimension 0, or a sequence of samples",
    )  # fmt: skip


def take(batch: Any, start: int, stop: int) -> Any:
    """Samples ``start .. stop-1`` of ``batch``, in the same structure (views, no copy)."""
    if _is_tensor(batch):
        return batch.narrow(0, start, stop - start)
    if isinstance(batch, Mapping):
        kind: Any = type(batch)  # dict, or a dict-like such as HF's BatchEncoding
        return kind({k: take(v, start, stop) if _is_tensor(v) else v for k, v in batch.items()})
    if isinstance(batch, (tuple, list)) and _tensors(batch):
        return type(batch)(take(v, start, stop) for v in batch)
    return batch[start:stop]


def spans(share: int, micro_batch: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the micro-batches that cover ``share`` samples in order."""
    if micro_batch < 1 or share % micro_batch:
        raise ConfigError("micro_batch", f"{micro_batch} does not divide the share {share}")
    return [(i, i + micro_batch) for i in range(0, share, micro_batch)]


def finer_split(micro_batch: int, share: int, floor: int = 1) -> int | None:
    """The next micro-batch after an OOM: the largest divisor of ``share`` that is at most half
    of ``micro_batch`` and at least ``floor`` (the supervisor's halving rung, in-process); None
    when the split cannot get finer."""
    for mb in range(micro_batch // 2, max(floor, 1) - 1, -1):
        if mb >= 1 and share % mb == 0:
            return mb
    return None
