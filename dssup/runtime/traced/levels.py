"""One recompute level's windows from its traces, and the profile's check on its own traces.

The traces' windows become the ``LevelTrace`` of ``dssup.memory.traced``: the model's first block
(``fwd:block:0``/``bwd:block:0``: it may create or free what the blocks share, the RoPE tables),
the other blocks of each kind (two of each in the reduced model, checked against each other),
the embedding, head and loss windows, and the batch. A block's forward window ends where the
next block starts (its frame may release tensors after it returns); nothing else may run
between blocks. ``self_check`` replays every trace with the finished profile and refuses it
beyond 0.1 %.
"""

from __future__ import annotations

from dssup.memory.traced import BatchTerm, KindTrace, LevelTrace, ReplayStage, TracedProfile, replay
from dssup.runtime.traced.fit import FitError, Point, fit_term, fit_window
from dssup.runtime.traced.step import TracedMeasurement

__all__ = ["SELF_CHECK", "level_trace", "point", "self_check"]

SELF_CHECK = 0.001  # the profile must replay its own traces within 0.1 %


def point(m: TracedMeasurement) -> Point:
    knobs = m.run.knobs
    return Point(
        knobs.micro_batch, knobs.seq_len, m.windows, m.timelines, m.parameters, m.peak_bytes
    )


def _total(w: dict[str, dict[str, int]], at: str) -> int:
    return w[at]["Total"]


def _merge_gaps(p: Point, kinds: list[str]) -> Point:
    """Blocks' forward windows ``fwdx:block:i`` that own the code around them.

    Between two blocks a model may release what the previous block's frame held (before the
    first operator of the gap) and run the next iteration's own operators (a cast of the RoPE
    tables, say). Block i's window takes the operators of the gap before it (i >= 1: block 0's
    are in ``fwd:pre``), its own, and the release after it; ``fwdx:post`` starts at the first
    operator after the last block. Every block then has the same structure whatever its
    neighbours' kinds."""
    last = len(kinds) - 1
    win, lines = dict(p.windows), dict(p.timelines)
    for i in range(last + 1):
        block, gap = p.windows[f"fwd:block:{i}"], p.windows[f"fwd:after:{i}"]
        ops_before: list[tuple[int, int, str]] = []
        start = block["start"]
        if i > 0:
            prev = p.windows[f"fwd:after:{i - 1}"]
            if "first" in prev:  # the previous gap's operators belong to this block
                start = prev["first"]
                ops_before = [
                    (t + _total(prev, "start") - _total(prev, "first"), g, op)
                    for t, g, op in p.timelines[f"fwd:after:{i - 1}"]
                ]
        shift = _total(block, "start") - start["Total"]
        after = gap.get("first", gap["end"]) if i < last or "first" in gap else gap["end"]
        timeline = ops_before + [(t + shift, g, op) for t, g, op in p.timelines[f"fwd:block:{i}"]]
        peak = max([start["Total"], *(t + start["Total"] for t, _, _ in timeline)])
        win[f"fwdx:block:{i}"] = {"start": start, "peak": {"Total": peak}, "end": after}
        lines[f"fwdx:block:{i}"] = timeline
    post = p.windows[f"fwd:after:{last}"]
    first = post.get("first", post["start"])
    # ``fwdx:post`` ends after autocast is left, less what that freed of the blocks' (their
    # own term ``released``, replayed per block: a model of any depth frees that many)
    end = dict(p.windows.get("fwd:exit", post)["end"])
    end["Total"] += sum(released(p, i) for i in range(last + 1))
    win["fwdx:post"] = {**post, "start": first, "end": end}
    lines["fwdx:post"] = [
        (t + _total(post, "start") - first["Total"], g, op)
        for t, g, op in p.timelines[f"fwd:after:{last}"]
    ]
    return Point(p.b, p.s, win, lines, p.parameters, p.peak)


def released(p: Point, i: int) -> int:
    """Bytes block i's forward window (with the gap before it, as ``_merge_gaps`` joins them)
    kept until autocast was left, which leaving it freed: its cached weight casts."""
    out = p.windows[f"fwd:block:{i}"].get("released", {}).get("Total", 0)
    if i > 0:
        out += p.windows[f"fwd:after:{i - 1}"].get("released", {}).get("Total", 0)
    return out


def level_trace(
    points: list[Point], kinds: list[str], params: dict[str, int], routed: float
) -> LevelTrace:
    points = [_merge_gaps(p, kinds) for p in points]
    out: dict[str, KindTrace] = {}
    for kind in dict.fromkeys(kinds):
        idx = [i for i, k in enumerate(kinds) if k == kind and i > 0]  # block 0: its own
        share = routed if kind == "moe" else 0.0
        out[kind] = KindTrace(
            forward=fit_window(
                f"{kind} forward", points, [f"fwdx:block:{i}" for i in idx], True, share
            ),
            backward=fit_window(
                f"{kind} backward", points, [f"bwd:block:{i}" for i in idx], False, share
            ),
            parameters=params[kind],
            released=_released_term(f"{kind} autocast release", points, idx),
        )

    def inputs(p: Point) -> float:
        start = p.windows["fwd:pre"]["start"]
        return start["Total"] - start.get("Parameter", 0)

    return LevelTrace(
        inputs=fit_term("batch", points, inputs, stored=True),
        pre=fit_window("embedding (fwd:pre)", points, ["fwd:pre"], True),
        post=fit_window("head and loss (fwd:post)", points, ["fwdx:post"], True),
        head=fit_window("backward head (bwd:head)", points, ["bwd:head"], False),
        embed=fit_window("backward embedding (bwd:embed)", points, ["bwd:embed"], False),
        first_forward=fit_window("first block forward", points, ["fwdx:block:0"], True),
        first_backward=fit_window("first block backward", points, ["bwd:block:0"], False),
        kinds=out,
        first_released=_released_term("first block autocast release", points, [0]),
    )


def _released_term(name: str, points: list[Point], idx: list[int]) -> BatchTerm | None:
    """What leaving autocast frees of one block of ``idx`` (None: nothing, as without amp)."""
    if not any(released(p, i) for p in points for i in idx):
        return None
    return fit_term(name, points, lambda p: max(released(p, i) for i in idx), stored=True)


def _phase_peak(m: TracedMeasurement, phase: str) -> int:
    return max(v["Total"] for k, v in m.phase_peaks.items() if k.endswith(f":{phase}"))


def self_check(
    profile: TracedProfile, level: str, kinds: list[str], traces: list[TracedMeasurement]
) -> float:
    """Replay every trace of ``level``; the worst relative miss (FitError beyond 0.1 %)."""
    order: list[tuple[str, int]] = []
    for k in kinds:
        if order and order[-1][0] == k:
            order[-1] = (k, order[-1][1] + 1)
        else:
            order.append((k, 1))
    worst, bad = 0.0, []
    for m in traces:
        b, s = m.run.knobs.micro_batch, m.run.knobs.seq_len
        st = ReplayStage(tuple(order), True, True, s, s, 1, 1.0, False, 1, 1.0)
        cands = replay(profile, level, st)
        w = m.windows["fwd:pre"]["start"].get("Parameter", 0)
        for phase in ("forward", "backward"):
            pred = w + max(c.at(b) for c in cands if c.phase == phase)
            got = _phase_peak(m, phase)
            miss = (pred - got) / got
            worst = max(worst, abs(miss))
            if abs(miss) > SELF_CHECK:
                bad.append(f"{level} b={b} s={s} {phase}: traced {got} B, replayed {pred} B")
    if bad:
        raise FitError("the profile does not reproduce its own traces", bad)
    return worst
