"""In-flight micro-batches per stage, against the schedules' own control flow.

DualPipe: a step-by-step replay of ``DualPipe.step`` (deepseek-ai/DualPipe 3da1bbe, steps 1-8,
counting each phase's forward and backward chunks; an overlapped F&B chunk runs its forward
before its backward frees) must give PP + 1 alive chunks per rank (arXiv 2412.19437 Table 2)
and, at that peak, PP - j micro-batches of stage j. Interleaved: Megatron-core's own example
table, and the warm-up count of ``get_pp_rank_microbatches``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dssup.errors import ConfigError
from dssup.memory.config import Layout
from dssup.memory.schedule import (
    _chunk_table,
    _states,
    check_micro_batches,
    held_counts,
    interleaved_states,
    steady_m,
)


def _replay_dualpipe(pp: int, rank: int, chunks: int) -> tuple[int, tuple[int, int]]:
    """Peak of alive (phase-0, phase-1) chunks on ``rank``, following ``DualPipe.step``.
    Returns (peak total, per-module counts at the first peak) with module 0 = stage ``rank``,
    module 1 = stage pp-1-rank (``phase ^= is_in_second_half``)."""
    half, hr = pp // 2, min(rank, pp - 1 - rank)
    second = rank >= pp // 2
    alive = [0, 0]
    best: list[object] = [-1, (0, 0)]

    def f(phase: int) -> None:
        alive[phase] += 1
        total = sum(alive)
        if total > best[0]:  # type: ignore[operator]
            counts = [0, 0]  # schedule phase p runs module p ^ is_in_second_half
            counts[0 ^ second], counts[1 ^ second] = alive[0], alive[1]
            best[0], best[1] = total, (counts[0], counts[1])

    def b(phase: int) -> None:
        alive[phase] -= 1

    for _ in range((half - hr - 1) * 2):  # step 1: nF0
        f(0)
    for _ in range(hr + 1):  # step 2: nF0F1
        f(0)
        f(1)
    for _ in range(half - hr - 1):  # step 3: nB1W1F1
        b(1)
        f(1)
    for _ in range(chunks // 2 - pp + hr + 1):  # step 4: nF0B1F1B0 (forward before backward)
        f(0)
        b(1)
        f(1)
        b(0)
    for _ in range(half - hr - 1):  # step 5: nB1F1B0
        b(1)
        f(1)
        b(0)
    return best[0], best[1]  # type: ignore[return-value]


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
@pytest.mark.parametrize("chunks_per_rank", [2, 3, 8])
def test_dualpipe_counts_follow_its_step_function(pp: int, chunks_per_rank: int) -> None:
    chunks = 2 * pp * chunks_per_rank  # even and >= 2 * pp, as step() asserts
    layout = Layout(pp=pp, ep=1, dp=1, schedule="dualpipe")
    for rank in range(pp):
        total, (own, mirror) = _replay_dualpipe(pp, rank, chunks)
        assert total == pp + 1  # arXiv 2412.19437 Table 2: activations PP + 1 per device
        counts = held_counts(layout, rank, (rank, pp - 1 - rank), chunks)
        assert counts == (pp - rank, rank + 1) == (own, mirror)


def test_dualpipe_needs_an_even_accumulation_of_at_least_twice_pp() -> None:
    layout = Layout(pp=4, dp=1, schedule="dualpipe")
    check_micro_batches(layout, 8)
    for m in (6, 9):
        with pytest.raises(ConfigError, match="DualPipe needs an even number"):
            check_micro_batches(layout, m)


def test_megatron_schedule_table_example() -> None:
    """megatron/core/pipeline_parallel/schedules.py: 'PP2 N3M5 with VP2' gives model chunks
    0 0 0 1 1 1 0 0 1 1."""
    assert _chunk_table(5, 2, 3) == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize(("pp", "vpp", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 4, 16)])
def test_interleaved_peak_count_is_megatrons_warmup_plus_one(pp: int, vpp: int, m: int) -> None:
    layout = Layout(pp=pp, vpp=vpp, dp=1, schedule="interleaved")
    for rank in range(pp):
        warmup = 2 * (pp - rank - 1) + (vpp - 1) * pp  # get_pp_rank_microbatches
        states = interleaved_states(layout, rank, m)
        assert max(sum(s) for s in states) == min(warmup + 1, m * vpp)
        assert all(0 <= n <= m for s in states for n in s)


def test_interleaved_last_rank_holds_one_loss_chunk() -> None:
    """The last rank's last chunk (the loss) is backwarded right after its forward."""
    layout = Layout(pp=4, vpp=2, dp=1, schedule="interleaved")
    assert max(s[-1] for s in interleaved_states(layout, 3, 16)) == 1


def test_interleaved_accumulation_rules() -> None:
    layout = Layout(pp=4, vpp=2, dp=1, schedule="interleaved")
    check_micro_batches(layout, 4)
    check_micro_batches(layout, 12)
    with pytest.raises(ConfigError, match="pp=4 <= 4 <= m=2"):
        check_micro_batches(layout, 2)
    with pytest.raises(ConfigError, match="last group of 2"):
        check_micro_batches(layout, 6)


def test_one_f_one_b_counts() -> None:
    layout = Layout(pp=4, dp=1)
    assert [held_counts(layout, i, (i,), 8) for i in range(4)] == [(4,), (3,), (2,), (1,)]
    assert [held_counts(layout, i, (i,), 2) for i in range(4)] == [(2,), (2,), (2,), (1,)]


# --- the same facts over generated schedules (hypothesis) --------------------------------

SCHEDULES = settings(max_examples=80, deadline=None)


@SCHEDULES
@given(st.integers(1, 16), st.integers(2, 12))
def test_dualpipe_replay_over_generated_sizes(half: int, chunks_per_direction: int) -> None:
    """Any even PP and any even m >= 2*PP: the step() replay and dssup agree on every rank."""
    pp = 2 * half
    chunks = 2 * max(pp, chunks_per_direction)
    layout = Layout(pp=pp, ep=1, dp=1, schedule="dualpipe")
    check_micro_batches(layout, chunks)
    for rank in range(pp):
        total, (own, mirror) = _replay_dualpipe(pp, rank, chunks)
        assert total == pp + 1
        assert held_counts(layout, rank, (rank, pp - 1 - rank), chunks) == (own, mirror)


def _megatron_alive(pp: int, vpp: int, group: int, m: int, rank: int) -> int:
    """Most (micro-batch, chunk) pairs alive at once on ``rank``, replayed as sets: warm-up
    forwards, then forward k+W, backward k; each backward must find its own forward done."""
    table = _chunk_table(m, vpp, group)
    seen: dict[int, int] = {}
    order = []  # (micro-batch, chunk) of forward k, as Megatron numbers them
    for c in table:
        order.append((seen.get(c, 0), c))
        seen[c] = seen.get(c, 0) + 1
    backward = [(mb, vpp - 1 - c) for mb, c in order]
    total = m * vpp
    warmup = min(2 * (pp - rank - 1) + (vpp - 1) * group, total)
    alive = set(order[:warmup])
    best = len(alive)
    for k in range(total - warmup):
        alive.add(order[k + warmup])
        best = max(best, len(alive))
        assert backward[k] in alive  # never a backward before its forward
        alive.remove(backward[k])
    for k in range(total - warmup, total):  # cool-down
        assert backward[k] in alive
        alive.remove(backward[k])
    assert not alive
    return best


@st.composite
def _interleaved(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(pp, vpp, group, m) that Megatron-core accepts."""
    pp = draw(st.integers(2, 8))
    vpp = draw(st.integers(2, 4))
    group = draw(st.integers(pp, 2 * pp))
    m = group * draw(st.integers(1, 4)) + draw(st.sampled_from([0, *range(pp, group)]))
    return pp, vpp, group, m


@SCHEDULES
@given(_interleaved())
def test_interleaved_states_over_generated_schedules(case: tuple[int, int, int, int]) -> None:
    """Every rank: the per-chunk counts dssup walks peak where a set replay of the schedule
    does, at Megatron's warm-up + 1; no chunk ever holds more than m; with the default group
    (G = PP) the loss chunk of the last rank holds one (a larger G lets a second one start)."""
    pp, vpp, group, m = case
    layout = Layout(pp=pp, vpp=vpp, dp=1, schedule="interleaved", vpp_group=group)
    check_micro_batches(layout, m)
    for rank in range(pp):
        states = interleaved_states(layout, rank, m)
        peak = max(sum(s) for s in states)
        assert peak == _megatron_alive(pp, vpp, group, m, rank)
        assert peak == min(2 * (pp - rank - 1) + (vpp - 1) * group + 1, m * vpp)
        assert all(len(s) == vpp and all(0 <= n <= m for n in s) for s in states)
    if group == pp:
        assert max(s[-1] for s in interleaved_states(layout, pp - 1, m)) == 1


@SCHEDULES
@given(st.integers(2, 8), st.integers(2, 6), st.integers(0, 8), st.integers(1, 40))
def test_past_one_steady_period_every_accumulation_walks_the_same_states(
    pp: int, vpp: int, extra: int, groups: int
) -> None:
    """``steady_m``: the walk of an accumulation count that runs a whole period (group x vpp
    forwards) past the warm-up records the states of the least such count, in order; a count
    it does not shorten walks as itself."""
    group = pp + extra
    m = group * groups
    for rank in range(pp):
        least = steady_m(pp, vpp, group, m, rank)
        assert least <= m and least % group == 0
        assert _states.__wrapped__(pp, vpp, group, m, rank) == _states(pp, vpp, group, least, rank)
        assert steady_m(pp, vpp, group, m + 1, rank) == m + 1  # not a multiple of the group
    warm = 2 * (pp - 1) + (vpp - 1) * group  # rank 0 warms up longest
    if m * vpp < warm:  # nothing runs a period past the warm-up: nothing is shortened
        assert steady_m(pp, vpp, group, m, 0) == m
