"""Make a ``FakeTensorMode`` trace of a CPU training step allocate what the real step allocates.

A fake trace is only worth something if it equals the real step byte for byte; the tests
compare both on the report's models. Two places differ without help, in torch 2.13.0 and
transformers 5.23.0 (both pinned; the tests fail when either changes):

* ``aten._grouped_mm``'s fake (meta) rule checks the CUDA kernel's bf16-only contract, while the
  CPU kernel takes fp32 too: transformers' grouped-mm experts in an fp32 model could not be
  traced. The rule here returns what the CPU kernel returns: a fresh, contiguous tensor of the
  grouped product's shape in the input dtype.
* transformers' mask builder checks whether the position ids pack several sequences into one row
  (``find_packed_sequence_indices``) by reading their values, and treats a fake tensor as a
  graph being traced: it would build an s x s mask the real step never builds. The step dssup
  runs has positions 0..s-1 in every row (one sequence each), for which the real check answers
  "not packed"; the trace gets that answer.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["cpu_fake_fixes"]

_aten = torch.ops.aten


def _grouped_mm_size(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> list[int]:
    """Output shape of ``_grouped_mm(a, b, offs)`` (2D/3D operand combinations)."""
    if a.dim() == 2:
        return [offs.size(0), a.size(0), b.size(1)] if b.dim() == 2 else [a.size(0), b.size(-1)]
    return [a.size(1), b.size(1)] if b.dim() == 2 else [a.size(0), a.size(1), b.size(-1)]


class _CpuKernels(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Fake results of CPU kernels whose meta rule disagrees with the CPU kernel."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (
            func is _aten._grouped_mm.default
            and isinstance(args[0], FakeTensor)
            and args[0].dtype != torch.bfloat16
        ):
            a, b = args[0], args[1]
            offs = args[2] if len(args) > 2 else kwargs.get("offs")
            dtype = kwargs.get("out_dtype") or a.dtype
            return torch.empty(_grouped_mm_size(a, b, offs), dtype=dtype, device=a.device)
        return func(*args, **kwargs)


@contextlib.contextmanager
def _unpacked_positions() -> Iterator[None]:
    masking: Any = sys.modules.get("transformers.masking_utils")
    if masking is None:
        yield
        return
    original = masking.find_packed_sequence_indices

    def find(position_ids: torch.Tensor) -> torch.Tensor | None:
        if isinstance(position_ids, FakeTensor):
            return None  # positions 0..s-1 in every row: no packed sequence (see docstring)
        return original(position_ids)  # type: ignore[no-any-return]

    masking.find_packed_sequence_indices = find
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


@contextlib.contextmanager
def cpu_fake_fixes() -> Iterator[None]:
    """Enter inside the MemTracker (innermost mode), so the tracker sees the fixed results."""
    with _unpacked_positions(), _CpuKernels():  # type: ignore[no-untyped-call]
        yield
