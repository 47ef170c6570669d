"""An independent second source for a real run's peak: torch.profiler allocation events.

MemTracker attributes storages through a dispatch mode; the profiler records every call into the
CPU allocator with its running ``total_allocated`` (counted from the moment profiling starts).
Bytes already alive before profiling (parameters, optimizer state, inputs) are summed directly
from the live tensors, deduplicated by storage. The two figures must agree to the byte.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._C._profiler import _EventType

__all__ = ["SENTINEL_BYTES", "ProfiledPeak", "live_bytes", "profiler_peak"]

SENTINEL_BYTES = 7919  # an odd size no tensor of a model step has


def live_bytes(model: nn.Module, opt: torch.optim.Optimizer, *extra: torch.Tensor) -> int:
    """Bytes of the distinct storages of parameters, buffers, gradients, optimizer state, inputs."""
    tensors: list[torch.Tensor] = [*model.parameters(), *model.buffers(), *extra]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for state in opt.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    seen: dict[int, int] = {}
    for t in tensors:
        if t.device.type != "cpu":  # an offloaded optimizer's host (meta): not CPU allocations
            continue
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


class ProfiledPeak:
    """Holds the profiler while it runs; ``peak()`` reads the highest running total after."""

    def __init__(self, prof: Any) -> None:
        self.prof = prof

    def peak(self) -> int:
        """Highest running total above the total at the session's first event (the CPU
        reporter's counter carries over whatever earlier sessions left allocated)."""
        events: list[tuple[int, int, int]] = []
        stack = list(self.prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            e = stack.pop()
            if e.tag == _EventType.Allocation:
                f = e.extra_fields
                events.append((e.start_time_ns, int(f.alloc_size), int(f.total_allocated)))
            stack.extend(e.children)
        if not events:
            return 0
        # The sentinel allocated right after the profiler started marks the counter's offset.
        sentinel = [total - size for _, size, total in events if size == SENTINEL_BYTES]
        offset = sentinel[0] if sentinel else min(total - size for _, size, total in events)
        return max(0, max(total for _, _, total in events) - offset)


@contextlib.contextmanager
def profiler_peak() -> Iterator[ProfiledPeak]:
    """Profile CPU memory events for the duration of the block."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        sentinel = torch.empty(SENTINEL_BYTES, dtype=torch.uint8)
        del sentinel
        yield ProfiledPeak(prof)
