"""Worker-process hygiene: a real memory cap for CPU jobs, and a clean exit.

``memory_cap`` turns a CPU-only worker into something that runs out of memory the way a GPU
does: glibc is told to map large blocks with ``mmap`` and give them back on free (so the address
space tracks live tensors), then ``RLIMIT_AS`` is set to the current size plus a budget. A
forward pass that needs more than the budget then fails inside torch's own allocator with
``DefaultCPUAllocator: can't allocate memory``. ``clean_exit`` ends a worker with a barrier and
``os._exit(0)``: letting Python tear down gloo threads aborts about one run in ten.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import resource
import sys
from typing import Any

from dssup.runtime.report import report_completed

__all__ = [
    "clean_exit",
    "free_heap_bytes",
    "mark_done",
    "memory_cap",
    "status_bytes",
    "trimmed_size_bytes",
    "vm_size_bytes",
]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 131072


def status_bytes(key: str) -> int:
    """A memory figure of this process from ``/proc/self/status`` (``VmSize``, ``VmPeak``,
    ``VmHWM``, ...), in bytes."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{key} not found in /proc/self/status")


def vm_size_bytes() -> int:
    """This process's current virtual size (``VmSize``)."""
    return status_bytes("VmSize")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def free_heap_bytes() -> int:
    """Bytes glibc keeps mapped but free in its heaps (``mallinfo2().fordblks``, every arena):
    address space a later allocation reuses without growing the process. 0 where the C library
    has no ``mallinfo2`` (glibc before 2.33, musl): nothing is then subtracted."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    info = getattr(libc, "mallinfo2", None)
    if info is None:
        return 0
    info.restype = _MallInfo2
    return int(info().fordblks)


def trimmed_size_bytes(collect: bool = True) -> int:
    """This process's virtual size once glibc maps large blocks on their own and has given the
    free top of its heap back (and, with ``collect``, Python's garbage is collected): the size
    a cap is measured from (freed heap and garbage must not count as live, or the cap is
    looser than it says)."""
    if collect:
        gc.collect()
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.malloc_trim(0)
    return vm_size_bytes()


def memory_cap(budget_bytes: int, collect: bool = True) -> int:
    """Limit this process's address space to its current size plus ``budget_bytes``.

    Returns the limit set. Linux only. Call it after start-up (imports, process group, model)
    so the budget measures what training itself allocates. ``collect=False`` leaves Python's
    garbage alone (a cap placed in the middle of a step counts what the step holds now).
    """
    limit = trimmed_size_bytes(collect) + budget_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def mark_done(step: int | None = None) -> None:
    """Under ``dssup run``: record that this rank finished training (a ``completed`` record in
    the job-side report, and a marker file in the attempt directory)."""
    attempt_dir = os.environ.get("DSSUP_ATTEMPT_DIR")
    if not attempt_dir:
        return
    report_completed(step, source="dssup.runtime.mark_done")
    done = os.path.join(attempt_dir, "done")
    os.makedirs(done, exist_ok=True)
    with open(os.path.join(done, f"rank-{os.environ.get('RANK', '0')}"), "w") as fh:
        fh.write("done\n")


def clean_exit(dist: Any | None = None, code: int = 0, step: int | None = None) -> None:
    """Barrier, destroy the process group, flush, ``os._exit``: no teardown abort after success.

    Under ``dssup run`` it first leaves a "done" marker for this rank in the attempt directory,
    so that an abort later in teardown is recognised as such, not as a training failure.
    """
    if code == 0:
        mark_done(step)
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
