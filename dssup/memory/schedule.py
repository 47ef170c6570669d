"""How many micro-batches each stage a device holds keeps alive at that device's peak.

The schedules, as their own code runs them (m = micro-batches per optimizer step and
data-parallel rank, rank i of pp):

* **1F1B** (Megatron-core ``forward_backward_pipelining_without_interleaving``): pp-i-1 warm-up
  forwards, then a forward before every backward, so stage i holds ``min(pp - i, m)``.
* **DualPipe** (arXiv 2412.19437, section 3.2.1, Table 2: parameters 2x, activations PP+1 per
  device; deepseek-ai/DualPipe ``dualpipe.py`` ``DualPipe.step`` at 3da1bbe): rank i holds
  stages i and pp-1-i. Steps 1-2 run 2(pp/2-h-1) + h+1 forwards of the phase starting at that
  rank and h+1 of the other (h = min(i, pp-1-i)); step 4 overlaps a forward with a backward,
  which is the "+1": stage j holds ``pp - j`` micro-batches at the peak, pp+1 per device, the
  loss stage one. ``step`` asserts an even m >= 2*pp (half the micro-batches per direction).
* **Interleaved** (Megatron-core ``schedules.py`` ``get_pp_rank_microbatches`` and
  ``get_schedule_table`` at NVIDIA/Megatron-LM d98e8a6): rank i runs
  W = 2(pp-i-1) + (vpp-1)*G warm-up forward chunks (G = micro-batches per virtual stage at a
  time, default pp), then forward k+W before backward k; forwards take chunks 0..vpp-1 in groups
  of G, backwards the same groups in reverse chunk order. Up to ``min(W + 1, m*vpp)`` chunk
  micro-batches are alive, but how many of each chunk changes along the schedule, so the
  device's peak is found by walking it (``interleaved_states``).
"""

from __future__ import annotations

from functools import lru_cache

from dssup.errors import ConfigError
from dssup.memory.config import Layout

__all__ = [
    "accumulation_rule",
    "check_micro_batches",
    "held_counts",
    "interleaved_states",
    "rank_states",
    "steady_m",
]


def accumulation_rule(layout: Layout, m: int) -> int:
    """Which of the schedule's own rules ``m`` micro-batches break: 0 none, 1 DualPipe's
    even m >= 2*pp, 2 the interleaved group bounds, 3 a short last interleaved group."""
    pp = layout.pp
    if layout.schedule == "dualpipe":
        return 1 if (m % 2 or m < 2 * pp) else 0
    if layout.schedule == "interleaved":
        group = layout.vpp_group or pp
        if group < pp or group > m:
            return 2
        if 0 < m % group < pp:
            return 3
    return 0


def check_micro_batches(layout: Layout, m: int) -> None:
    """Refuse an accumulation count the schedule's own code refuses."""
    rule = accumulation_rule(layout, m)
    if rule == 0:
        return
    pp = layout.pp
    if rule == 1:
        raise ConfigError(
            "grad_accum",
            f"DualPipe needs an even number of micro-batches >= 2*pp = {2 * pp} per "
            f"data-parallel rank, not {m} (deepseek-ai/DualPipe asserts num_chunks >= 2*num_ranks)",
            "raise --global-batch-size or lower --micro-batch",
        )
    group = layout.vpp_group or pp
    if rule == 2:
        raise ConfigError(
            "grad_accum",
            f"interleaving runs {group} micro-batches per virtual stage at a time, which "
            f"needs pp={pp} <= {group} <= m={m} (Megatron-core raises ValueError)",
            "raise --global-batch-size, lower --micro-batch or set vpp_group",
        )
    raise ConfigError(
        "grad_accum",
        f"m={m} leaves a last group of {m % group} < pp={pp} micro-batches "
        "(Megatron-core raises RuntimeError)",
        f"use a multiple of {group} micro-batches",
    )


def held_counts(layout: Layout, rank: int, stages: tuple[int, ...], m: int) -> tuple[int, ...]:
    """In-flight micro-batches of each held stage at the device's peak (1F1B, DualPipe)."""
    pp = layout.pp
    if pp == 1:
        return (1,) * len(stages)
    if layout.schedule == "dualpipe":
        return tuple(pp - j for j in stages)
    return (min(pp - rank, m),)


def interleaved_states(layout: Layout, rank: int, m: int) -> tuple[tuple[int, ...], ...]:
    """Distinct per-chunk alive counts along rank ``rank``'s interleaved schedule, after each
    forward (the moments a peak can happen); chunk c is virtual stage c*pp + rank."""
    return rank_states(layout.pp, layout.vpp, layout.vpp_group or layout.pp, rank, m)


def rank_states(pp: int, vpp: int, group: int, rank: int, m: int) -> tuple[tuple[int, ...], ...]:
    """``interleaved_states`` by the schedule's numbers (``group``: micro-batches per virtual
    stage at a time)."""
    return _states(pp, vpp, group, steady_m(pp, vpp, group, m, rank), rank)


def steady_m(pp: int, vpp: int, group: int, m: int, rank: int) -> int:
    """The least accumulation count whose states are ``m``'s (``m`` itself if none is less).

    With ``m`` a multiple of ``group`` the forwards take the chunks in a period of
    ``P = group * vpp`` (``_chunk_table``), and each period runs every chunk ``group`` times
    forward and backward: the alive counts after forward ``k + W`` repeat with period P. Once
    ``m * vpp >= W + P`` the walk records every state of one period before any repeats, in the
    same order, so every such ``m`` has the states -- the same tuple -- of the least one."""
    if m % group:
        return m
    warmup = 2 * (pp - rank - 1) + (vpp - 1) * group
    least = -(-(warmup + group * vpp) // vpp)  # m * vpp >= W + P
    least = -(-least // group) * group  # a multiple of group
    return min(m, least)


@lru_cache(maxsize=4096)
def _states(pp: int, vpp: int, group: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
    total = m * vpp
    chunk = _chunk_table(m, vpp, group)
    warmup = min(2 * (pp - rank - 1) + (vpp - 1) * group, total)
    alive = [0] * vpp  # forwards run less backwards run, per chunk
    for k in range(warmup):
        alive[chunk[k]] += 1
    seen: dict[tuple[int, ...], None] = {}
    if warmup == total:  # everything runs forward before the first backward
        seen[tuple(alive)] = None
    last = vpp - 1
    for k in range(total - warmup):
        alive[chunk[k + warmup]] += 1
        seen[tuple(alive)] = None
        alive[last - chunk[k]] -= 1
    return _maximal(tuple(seen))


def _chunk_table(m: int, vpp: int, group: int) -> list[int]:
    """Model chunk of each forward virtual micro-batch (Megatron ``get_schedule_table``)."""
    out: list[int] = []
    for lo in range(0, m, group):
        size = m - lo if lo + group >= m else group
        for c in range(vpp):
            out += [c] * size
    return out


def _maximal(states: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Drop states another state dominates in every chunk (they can never be the peak). The
    states are distinct, so a state that dominates another has a larger total: only those are
    compared."""
    totals = [sum(s) for s in states]
    keep = []
    for s, n in zip(states, totals, strict=True):
        if not any(
            t > n and all(a >= b for a, b in zip(o, s, strict=True))
            for o, t in zip(states, totals, strict=True)
        ):
            keep.append(s)
    return tuple(keep)
