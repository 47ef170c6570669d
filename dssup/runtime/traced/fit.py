"""Fit a level's windows from traces, and refuse a fit that does not describe its own traces.

Every quantity a window yields (bytes at its peak and end over its start) is fitted as
``b * per_sample(s) + constant(s)``: for each traced sequence length a line in b through three or
more micro-batches -- the same micro-batches for every sequence length and every block --
whose middle points must lie on it; then the slopes and intercepts as ``c0 + c1*s + c2*s^2``
through the sequence lengths. Blocks of one kind must leave the same numbers (the reduced model
holds two of each kind). Stored bytes (what a block or the embedding keeps for backward, and
what the batch holds) may not have a negative per-sample term at any traced sequence length.

``FitError`` carries the traces that disagree; ``dssup calibrate`` refuses the profile with them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dssup.errors import DssupError
from dssup.memory.traced import BatchTerm, Moment, SeqPoly, Window

__all__ = ["FitError", "Point", "fit_term", "fit_window"]

# Fake traces are exact integers: a linear quantity misses its line by nothing. Allow rounding
# of the exact-rational fit only.
TOLERANCE_BYTES = 64


class FitError(DssupError):
    """The traces do not follow the profile's model; ``disagree`` names them."""

    def __init__(self, message: str, disagree: list[str]) -> None:
        self.disagree = disagree
        super().__init__(message + ": " + "; ".join(disagree))


@dataclass(frozen=True)
class Point:
    """One trace: its micro-batch, sequence length and windows (categories at start/peak/end)."""

    b: int
    s: int
    windows: dict[str, dict[str, dict[str, int]]]
    timelines: dict[str, list[tuple[int, int, str]]]
    parameters: int
    peak: int


def _quadratic(xs: Sequence[int], ys: Sequence[float]) -> tuple[float, float, float]:
    """Exact ``c0 + c1 x + c2 x^2`` through three points (Lagrange)."""
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    d0, d1, d2 = (x0 - x1) * (x0 - x2), (x1 - x0) * (x1 - x2), (x2 - x0) * (x2 - x1)
    c2 = y0 / d0 + y1 / d1 + y2 / d2
    c1 = -(y0 * (x1 + x2) / d0 + y1 * (x0 + x2) / d1 + y2 * (x0 + x1) / d2)
    c0 = y0 * x1 * x2 / d0 + y1 * x0 * x2 / d1 + y2 * x0 * x1 / d2
    return c0, c1, c2


def _poly(xs: Sequence[int], ys: Sequence[float]) -> SeqPoly:
    if len(set(xs)) == 1:
        return SeqPoly(c=(ys[0], 0.0, 0.0))
    if len(xs) == 2:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        return SeqPoly(c=(ys[0] - slope * xs[0], slope, 0.0))
    return SeqPoly(c=_quadratic(xs[:3], ys[:3]))


def fit_term(
    name: str, points: Sequence[Point], value: Callable[[Point], float], stored: bool = False
) -> BatchTerm:
    """``value`` over ``points`` (a b x s grid) as a BatchTerm, checked as described above."""
    seqs = sorted({p.s for p in points})
    slopes, intercepts, bad = [], [], []
    for s in seqs:
        row = sorted((p for p in points if p.s == s), key=lambda p: p.b)
        if len(row) < 3:
            raise FitError(f"{name}: fewer than three micro-batches at s={s}", [])
        (b0, v0), (b1, v1) = (row[0].b, value(row[0])), (row[-1].b, value(row[-1]))
        slope = (v1 - v0) / (b1 - b0)
        for p in row[1:-1]:
            miss = value(p) - (v0 + slope * (p.b - b0))
            if abs(miss) > TOLERANCE_BYTES:
                bad.append(
                    f"{name} at b={p.b}, s={s}: {value(p):.0f} B, the line through b={b0} and "
                    f"b={b1} gives {v0 + slope * (p.b - b0):.0f} B"
                )
        if stored and slope < 0:
            bad.append(f"{name}: negative bytes per sample at s={s} ({slope:.0f} B)")
        slopes.append(slope)
        intercepts.append(v0 - slope * b0)
    if bad:
        raise FitError(f"{name} is not linear in the micro-batch", bad)
    return BatchTerm(per_sample=_poly(seqs, slopes), constant=_poly(seqs, intercepts))


def _delta(w: dict[str, dict[str, int]], at: str, key: str = "Total") -> int:
    return w[at].get(key, 0) - w["start"].get(key, 0)


Line = list[tuple[int, int, str]]


def _timeline(p: Point, labels: Sequence[str], name: str) -> Line:
    """The window's moments at point ``p``: the largest over the blocks ``labels`` (which must
    run the same operators and, but for rounding, hold the same bytes)."""
    lines = [_aligned(p.timelines[lb], p.timelines[labels[0]], f"{name} at b={p.b}, s={p.s}")
             for lb in labels]  # fmt: skip
    out = []
    for moment in zip(*lines, strict=True):
        lo, hi = min(m[0] for m in moment), max(m[0] for m in moment)
        if hi - lo > max(TOLERANCE_BYTES, 0.001 * abs(hi)):
            raise FitError(
                f"blocks of one kind disagree in {name}",
                [f"{lb}: {m[0]} B after {m[2]}" for lb, m in zip(labels, moment, strict=True)],
            )
        out.append(max(moment))
    return out


def _aligned(line: Line, ref: Line, where: str) -> Line:
    """``line`` on the operators of ``ref``. A step may run an operator once more (a cache
    filled on first use at a new size): one that holds a peak of its own is refused, any
    other is dropped; an operator ``line`` lacks takes the larger of its neighbours."""
    names, ref_names = [x[2] for x in line], [x[2] for x in ref]
    if names == ref_names:
        return line
    out: Line = []
    matcher = difflib.SequenceMatcher(a=ref_names, b=names, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out += line[j1:j2]
            continue
        for j in range(j1, j2):  # extra in ``line``
            here = line[j][0]
            if (j == 0 or here > line[j - 1][0]) and (j + 1 == len(line) or here > line[j + 1][0]):
                raise FitError(
                    "operator sequences differ between traces", [f"{where}: {line[j][2]} peaks"]
                )
        for i in range(i1, i2):  # missing in ``line``
            left = line[j1 - 1][0] if j1 else 0
            right = line[j2][0] if j2 < len(line) else left
            out.append((max(left, right), ref[i][1], ref[i][2]))
    return out


def _dominated(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True))


def _pareto(moments: list[Moment], seqs: Sequence[int]) -> list[Moment]:
    """Drop moments that another one tops at every micro-batch (>= 1) and length (traced,
    and four times the longest)."""
    probe = [*seqs, 4 * max(seqs)]

    def key(mo: Moment) -> tuple[float, ...]:
        t = mo.bytes
        vals = [t.constant.at(s, s) + t.per_sample.at(s, s) for s in probe]
        vals += [t.per_sample.at(s, s) for s in probe]
        return (*vals, -mo.grads)  # fewer gradient bytes: the smaller when they shard

    keys = [key(mo) for mo in moments]
    # Neighbours first (most moments are topped by the next operator's), then all pairs.
    near = [
        i
        for i in range(len(moments))
        if not any(
            0 <= j < len(moments) and _dominated(keys[i], keys[j]) and (keys[i] != keys[j] or j < i)
            for j in (i - 1, i + 1)
        )
    ]
    moments, keys = [moments[i] for i in near], [keys[i] for i in near]
    out = []
    for i, mo in enumerate(moments):
        if not any(j != i and _dominated(keys[i], keys[j]) and (keys[i] != keys[j] or j < i)
                   for j in range(len(moments))):  # fmt: skip
            out.append(mo)
    return out


def fit_window(
    name: str, points: Sequence[Point], labels: Sequence[str], stored: bool, routed: float = 0.0
) -> Window:
    """The Window of ``labels`` (blocks of one kind, or one window) over the grid ``points``."""
    lines = {id(p): _timeline(p, labels, name) for p in points}
    counts = [len(x) for x in lines.values()]
    ref = max(lines.values(), key=lambda x: counts.count(len(x)))  # the most common sequence
    lines = {k: _aligned(v, ref, name) for k, v in lines.items()}
    moments = []
    for j in range(len(lines[id(points[0])])):

        def value(q: Point, j: int = j) -> float:
            return lines[id(q)][j][0]

        term = fit_term(f"{name} operator {j}", points, value)
        grads = max(lines[id(q)][j][1] for q in points)
        moments.append(Moment(bytes=term, grads=max(grads, 0)))

    def end(q: Point) -> float:
        return max(_delta(q.windows[lb], "end") for lb in labels)

    grads = max(_delta(p.windows[lb], "end", "Gradient") for lb in labels for p in points)
    return Window(
        moments=_pareto(moments, sorted({p.s for p in points})) if moments else [_zero()],
        end=fit_term(f"{name} end", points, end, stored),
        grads=max(grads, 0),
        routed=routed,
    )


def _zero() -> Moment:
    z = SeqPoly(c=(0.0, 0.0, 0.0))
    return Moment(bytes=BatchTerm(per_sample=z, constant=z))
