"""How much address space a piece of training needs *on the machine the tests run on*.

Tests that want an OOM on one side of a config change and none on the other (micro-batch 2
fails, micro-batch 2 with recompute passes) used to cap the workers at a number of MiB measured
once, by hand, on one machine. Another machine's kernels, allocator and libraries move those
needs by a few MiB, and the OOM then lands elsewhere or not at all. Here the need is measured
where the test runs, with the very mechanism the workers use (``dssup.runtime.memory_cap``,
``RLIMIT_AS`` above the current size): ``need_bytes`` bisects the smallest budget under which a
callable runs without an allocator failure. ``probe`` runs a probe script in a subprocess (the
cap is per process) and returns its JSON; ``cap_between`` places a cap between the need that
must fail and the need that must pass (their geometric mean), and fails the test with a line
that says what this machine lacks when the two are too close to separate.

A probe measures one process without gloo or DDP, so the real workers need a little more (DDP's
gradient buckets and gloo's buffers, a few MiB): the geometric mean leaves the passing side most
of that room (2-5 MiB more than the probe, measured with torchrun on a 2-core VM), and
``cap_between`` insists on keeping it.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["HEAP", "MALLOC", "cap_between", "need_bytes", "probe"]

ROOT = Path(__file__).resolve().parents[1]
# glibc's heap as every capped worker sees it, whatever the caller's environment says: blocks
# over 128 KiB mapped and unmapped on their own (the address space tracks live tensors), the
# heap trimmed and padded by glibc's defaults (a caller's 64 MiB MALLOC_TOP_PAD_ let a 32 MiB
# block fall back into the padded heap), mmap never refused. Given both as the MALLOC_*
# variables and as GLIBC_TUNABLES, whose other tunables the caller set (glibc.cpu.*, ...) stay.
_HEAP = {"mmap_threshold": 131072, "trim_threshold": 131072, "top_pad": 131072, "mmap_max": 65536}


def tunables(malloc: dict[str, int], caller: str | None = None) -> str:
    """``GLIBC_TUNABLES`` with ``malloc`` for glibc.malloc.* and the caller's other tunables."""
    given = os.environ.get("GLIBC_TUNABLES", "") if caller is None else caller
    kept = [t for t in given.split(":") if t and not t.startswith("glibc.malloc.")]
    return ":".join([*kept, *(f"glibc.malloc.{k}={v}" for k, v in malloc.items())])


HEAP = {f"MALLOC_{k.upper()}_": str(v) for k, v in _HEAP.items()} | {
    "GLIBC_TUNABLES": tunables(_HEAP)
}
# The one-tensor and probed workers also use one malloc arena (a new thread's arena would
# reserve 64 MiB of the cap; a caller's MALLOC_ARENA_MAX=2 let gloo's buffer fit in an arena
# reserved before the cap) and one OpenMP thread.
MALLOC = HEAP | {
    "MALLOC_ARENA_MAX": "1",
    "GLIBC_TUNABLES": tunables(_HEAP | {"arena_max": 1}),
    "OMP_NUM_THREADS": "1",
}
MiB = 1 << 20


def _fits(fn: Callable[[], None], budget: int) -> bool:
    from dssup.runtime import memory_cap
    from dssup.runtime.oom import is_oom

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    memory_cap(budget)
    try:
        fn()
        return True
    except (RuntimeError, MemoryError) as exc:
        if not is_oom(exc):
            raise
        return False
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        gc.collect()


def need_bytes(fn: Callable[[], None], resolution: int = MiB // 4, limit: int = 8 << 30) -> int:
    """The smallest ``memory_cap`` budget (to ``resolution``) under which ``fn`` runs; call it
    in a process of its own, after a warm-up run of ``fn`` (lazy imports, kernels' first use)."""
    low, high = 0, 16 * MiB
    while not _fits(fn, high):
        low, high = high, high * 2
        if high > limit:
            raise RuntimeError(f"needs more than {limit / MiB:.0f} MiB of address space")
    while high - low > resolution:
        mid = (low + high) // 2
        low, high = (low, mid) if _fits(fn, mid) else (mid, high)
    return high


@functools.cache
def probe(script: str, *args: str) -> dict[str, Any]:
    """Run ``script ARGS`` (a probe that prints one JSON object) with the workers' malloc
    settings; cached for the session, since a machine's needs do not change within it."""
    env = {**os.environ, **MALLOC, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True, text=True, timeout=600, env=env, check=False, cwd=ROOT,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"probe {script} {args} failed:\n{res.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def cap_between(
    must_fail: int, must_pass: int, what: str, min_ratio: float = 1.2, min_spare_mib: int = 8
) -> int:
    """A budget in MiB between two measured needs (bytes): their geometric mean, rounded down.
    Fails the calling test, naming both needs, when they differ by less than ``min_ratio`` or
    the passing side would keep less than ``min_spare_mib`` for the workers' own buffers."""
    import pytest

    cap = int((must_fail * must_pass) ** 0.5)
    if must_fail < min_ratio * must_pass or cap - must_pass < min_spare_mib * MiB:
        pytest.fail(
            f"{what}: on this machine the config that must fail needs {must_fail / MiB:.1f} MiB "
            f"and the one that must pass {must_pass / MiB:.1f} MiB: too close for a cap between "
            f"them (wanted {min_ratio}x apart and {min_spare_mib} MiB spare for the workers' "
            "own buffers)"
        )
    return cap // MiB
