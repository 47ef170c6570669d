"""The planner's inner loop: the peak of one config from precomputed device rows, and which
micro-batches of a (layout, ZeRO, offload, recompute) choice fit, found by bisection.

Why bisection: for a fixed choice the peak only grows with the micro-batch b. Per device it is
``static + acts * b * in_flight(rows / b) + work * b``, and ``b * min(PP - i, rows / b)`` =
``min(b * (PP - i), rows)`` grows with b (1F1B); DualPipe and PP = 1 keep fixed counts; an
interleaved schedule's alive chunks are checked to grow the same way from the schedule's own
shape (``_shape_grows``, independent of the bytes), else every b is evaluated. So the largest
fitting b splits the sorted micro-batches into a fitting prefix and a rest that does not fit:
O(log n) peaks instead of n, and every fitting config still gets its own step time. The
arithmetic is exactly ``estimate``'s (a property test re-estimates every planned config).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from functools import lru_cache
from typing import NamedTuple

from dssup.memory.config import Layout, Recompute
from dssup.memory.core import PreparedDevice, device_in_flight
from dssup.memory.schedule import rank_states
from dssup.memory.traced_stage import TracedStage

__all__ = ["InFlight", "Row", "fit_prefix", "peak"]


class InFlight:
    """Per-sample bytes of an interleaved device's in-flight chunks at its peak, by recompute
    level and accumulation count, computed when first asked for (most are never asked)."""

    __slots__ = ("cache", "dev", "layout")

    def __init__(self, dev: PreparedDevice, layout: Layout) -> None:
        self.dev = dev
        self.layout = layout
        self.cache: dict[tuple[Recompute, int], int] = {}

    def get(self, rc: Recompute, m: int) -> int:
        key = (rc, m)
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = device_in_flight(self.dev, self.layout, rc, m)[0]
        return found

    def grows(self, micro: tuple[int, ...], rows: int) -> bool:
        """Whether b x the alive chunks never shrinks as b grows, for any stage bytes."""
        lay = self.layout
        return _shape_grows(lay.pp, lay.vpp, lay.vpp_group or lay.pp, self.dev.index, rows, micro)


@lru_cache(maxsize=4096)
def _shape_grows(
    pp: int, vpp: int, group: int, rank: int, rows: int, micro: tuple[int, ...]
) -> bool:
    """Every alive-chunk state at b, scaled by b, is covered chunk by chunk by a state at the
    next larger b scaled by that b: then ``b * in_flight_bytes`` grows with b for any
    non-negative per-chunk bytes."""
    prev: tuple[int, tuple[tuple[int, ...], ...]] | None = None
    for b in micro:
        cur = (b, rank_states(pp, vpp, group, rank, rows // b))
        if prev is not None:
            b1, low = prev
            b2, high = cur
            if low == high:  # the same states (``schedule.steady_m``): each covers itself
                prev = cur
                continue
            for s in low:
                if not any(all(b1 * x <= b2 * y for x, y in zip(s, t, strict=True)) for t in high):
                    return False
        prev = cur
    return True


class Row(NamedTuple):
    """One device kind under one (ZeRO, offload) choice: what the inner loop reads."""

    stage: int
    depth: int  # pp - index: 1F1B in-flight bound
    fixed: int  # in-flight count independent of m (pp == 1, DualPipe); 0 = use depth/m
    acts: dict[Recompute, int]  # per-sample bytes of one in-flight unit (DualPipe: all of them)
    work: dict[Recompute, int]  # per-sample backward working set, once per device
    const: dict[Recompute, int]  # batch-independent saved bytes (autocast copies)
    table: InFlight | None  # interleaved: in-flight per-sample bytes by (level, m)
    base_fb: int
    opt: int
    shard: int
    # later backward moments (eager end of backward, freed gradients): per level, pairs of
    # (batch-independent bytes with static and buffers, per-sample bytes)
    tails: dict[Recompute, tuple[tuple[int, int], ...]]
    device: PreparedDevice | None = None  # a traced profile: the device to replay
    traced: dict[Recompute, TracedStage] | None = None  # a traced profile: replay by level


def peak(
    rows: list[Row], rc: Recompute, b: int, m: int, frag: float, extra: int
) -> tuple[int, Row, str]:
    """(total bytes, the peak device's row, its phase) of one config: ``estimate``'s assembly."""
    best, row, fb_best = -1, rows[0], 0
    for g in rows:
        if g.table is not None:
            acts = g.table.get(rc, m)
        else:
            depth = g.depth
            acts = g.acts[rc] * (g.fixed or (depth if depth < m else m))
        fb = g.base_fb + g.const[rc] + (acts + g.work[rc]) * b
        for const, per in g.tails[rc]:  # a later backward moment can top its start
            fb = max(fb, const + per * b)
        alloc = fb if fb >= g.opt else g.opt
        if alloc > best:
            best, row, fb_best = alloc, g, fb
    phase = "forward-backward" if fb_best >= row.opt else "optimizer-step"
    return best + math.ceil(best * frag) + extra, row, phase


def fit_prefix(
    rows: list[Row],
    rc: Recompute,
    micro: list[int],
    n_rows: int,
    frag: float,
    extra: int,
    limit: int,
) -> tuple[int, list[int] | None]:
    """(how many of the sorted micro-batches fit ``limit`` bytes -- all of the first that many --,
    None) when the peak is known to grow with b; else (0, the indices that fit), every one
    evaluated."""
    grows = all(g.table.grows(tuple(micro), n_rows) for g in rows if g.table is not None)
    if grows:
        k = bisect_left(
            range(len(micro)),
            True,
            key=lambda i: peak(rows, rc, micro[i], n_rows // micro[i], frag, extra)[0] > limit,
        )
        return k, None
    return 0, [
        i for i, b in enumerate(micro) if peak(rows, rc, b, n_rows // b, frag, extra)[0] <= limit
    ]
