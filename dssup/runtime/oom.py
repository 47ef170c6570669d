"""Is this exception an out-of-memory error that the step guard may recover from?

The exception's type decides first: ``torch.OutOfMemoryError`` (CUDA, and the other device
backends that raise it) and Python's ``MemoryError``. Allocators that raise a plain
``RuntimeError`` are recognised by their own message, the same texts accelerate's
``should_reduce_batch_size`` and the supervisor's signature table
(``dssup.supervisor.signatures``) know; a test checks that every message recognised here is an
OOM there too, so the job and the supervisor never disagree about what an OOM is. The CPU
allocator's failure under ``dssup.runtime.memory_cap`` is one of them: it is how CPU tests
get a real allocation failure.
"""

from __future__ import annotations

import re

__all__ = ["OOM_MESSAGES", "is_oom", "oom_text"]

# Messages of allocators that raise RuntimeError rather than torch.OutOfMemoryError.
OOM_MESSAGES: tuple[str, ...] = (
    "DefaultCPUAllocator: can't allocate memory",
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "HIP out of memory",
    "XPU out of memory",
    "MPS backend out of memory",
)
_MESSAGE = re.compile("|".join(re.escape(m) for m in OOM_MESSAGES))


def is_oom(exc: BaseException) -> bool:
    """True for an allocation failure (see the module docstring), False for anything else."""
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - the guard itself needs torch
        pass
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and bool(_MESSAGE.search(str(exc)))


def oom_text(exc: BaseException) -> str:
    """The exception as one line (type and the first line of its message), for the report."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:500]
