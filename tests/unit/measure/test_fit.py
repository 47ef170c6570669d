"""A fit that cannot lie: exact on data that follows the model, refused (with the traces that
disagree) on data that does not. Synthetic windows stand in for traces here; the real traces
are fitted in tests/integration/measure/test_calibrate_hf.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dssup.runtime.traced.fit import FitError, Point, fit_term, fit_window

GRID = [(b, s) for s in (16, 32, 64) for b in (2, 3, 4)]


def _point(b: int, s: int, lines: dict[str, list[int]], names: list[str] | None = None) -> Point:
    windows = {
        lb: {
            "start": {"Total": 0},
            "peak": {"Total": max(v)},
            "end": {"Total": v[-1]},
        }
        for lb, v in lines.items()
    }
    timelines = {
        lb: [(x, 0, names[i] if names else f"op{i}") for i, x in enumerate(v)]
        for lb, v in lines.items()
    }
    return Point(b, s, windows, timelines, 1000, max(max(v) for v in lines.values()))


def grid(f: Callable[[int, int], list[int]], labels: tuple[str, ...] = ("w",)) -> list[Point]:
    return [_point(b, s, {lb: f(b, s) for lb in labels}) for b, s in GRID]


def test_exact_quadratic_in_the_sequence_and_linear_in_the_batch() -> None:
    def value(b: int, s: int) -> int:
        return b * (7 * s + 3 * s * s) + 100 + 5 * s

    pts = grid(lambda b, s: [value(b, s)])
    t = fit_term("w", pts, lambda p: p.timelines["w"][0][0])
    for b, s in [(1, 512), (8, 256), (5, 100)]:  # outside the traced grid
        assert b * t.per_sample.at(s, s) + t.constant.at(s, s) == pytest.approx(value(b, s))


def test_a_kink_in_the_batch_is_refused_with_the_point() -> None:
    pts = grid(lambda b, s: [max(1000, 300 * b) * s])
    with pytest.raises(FitError, match=r"w at b=3, s=16: .* the line through b=2 and b=4"):
        fit_term("w", pts, lambda p: p.timelines["w"][0][0])


def test_negative_stored_bytes_per_sample_are_refused() -> None:
    pts = grid(lambda b, s: [10_000 - b * s])
    with pytest.raises(FitError, match="negative bytes per sample"):
        fit_term("stored", pts, lambda p: p.timelines["w"][0][0], stored=True)


def test_every_moment_is_kept_that_is_the_peak_somewhere() -> None:
    # op0: large constant, small slope (the peak at b = 1); op1: the peak at larger b; op2 is
    # below op1 everywhere and goes.
    def lines(b: int, s: int) -> list[int]:
        return [50_000 + 10 * b * s, 20_000 + 100 * b * s, 10_000 + 90 * b * s]

    w = fit_window("w", grid(lines), ["w"], stored=True)
    assert len(w.moments) == 2
    for b in (1, 2, 8):
        best = max(
            b * m.bytes.per_sample.at(32, 32) + m.bytes.constant.at(32, 32) for m in w.moments
        )
        assert best == pytest.approx(max(lines(b, 32)))


def test_blocks_of_one_kind_must_hold_the_same_bytes() -> None:
    def lines(b: int, s: int) -> dict[str, list[int]]:
        return {"a": [100 * b * s], "b": [100 * b * s + (5000 if b == 4 else 0)]}

    pts = [_point(b, s, lines(b, s)) for b, s in GRID]
    with pytest.raises(FitError, match="blocks of one kind disagree"):
        fit_window("dense forward", pts, ["a", "b"], stored=True)


def test_an_operator_run_once_more_is_dropped_unless_it_holds_a_peak() -> None:
    def lines(b: int, s: int, extra: int | None) -> list[int]:
        base = [100 * b * s, 300 * b * s, 200 * b * s]
        return base if extra is None else [*base[:2], extra, base[2]]

    names = ["mm", "silu", "mul"]
    extra = ["mm", "silu", "clone", "mul"]
    pts = [_point(b, s, {"w": lines(b, s, None)}, names) for b, s in GRID]
    pts[0] = _point(2, 16, {"w": lines(2, 16, 250 * 2 * 16)}, extra)  # a cache filled once
    w = fit_window("w", pts, ["w"], stored=True)
    assert len(w.moments) == 1
    pts[0] = _point(2, 16, {"w": lines(2, 16, 10**9)}, extra)  # ... that would hold the peak
    with pytest.raises(FitError, match="operator sequences differ"):
        fit_window("w", pts, ["w"], stored=True)
