"""The ``dssup plan`` table: every row with its framework and layer split, the rows within the
memory model's uncertainty of the GPU marked, and what the search skipped said in words.

Why its own module: a plan row is read as an instruction (this layout, this split, this
framework), so the table must carry everything needed to run it, and the lines around it
everything needed to trust it: the capacity judged against, the margin, the uncertainty band
and its source, and whether the search was bounded.
"""

from __future__ import annotations

from dssup.cli.render import gib, table
from dssup.memory import PlanResult
from dssup.memory.config import Layout
from dssup.memory.gpus import find_gpu, usable_memory_note
from dssup.memory.splits import describe_split

__all__ = ["capacity_note", "render_plan", "split_words"]

_HEADER = (
    "#",
    "framework",
    "tp",
    "pp",
    "ep",
    "dp",
    "sched",
    "split",
    "micro",
    "accum",
    "recompute",
    "zero",
    "offload",
    "peak GiB",
    "headroom",
    "limit",
    "step s",
    "host/node",
    "phase",
)


def split_words(lay: Layout) -> str:
    """The layer split of a row: ``even``, or the counts per (virtual) stage (``3,4x14,2``)."""
    if lay.pp == 1:
        return "-"
    return "even" if lay.layers_per_stage is None else describe_split(lay.layers_per_stage)


def capacity_note(gpu_memory: str, margin: float) -> str:
    """What the fit was judged against: a GPU's CUDA-usable memory (with its source) or the
    size given, less the margin."""
    spec = find_gpu(gpu_memory, "--gpu-memory")
    what = (
        f"GPU memory {usable_memory_note(spec)}"
        if spec is not None
        else f"GPU memory {gpu_memory} as given (the memory CUDA can allocate)"
    )
    kept = f"; --margin {margin:g} keeps {margin:.1%} of it free" if margin else "; no margin"
    return what + kept


def render_plan(res: PlanResult, top: int, margin: float = 0.0) -> str:
    rows: list[tuple[str, ...]] = []
    for i, c in enumerate(res.candidates[:top], 1):
        t, lay = c.training, c.layout
        off = "both" if t.offload_params else ("optimizer" if t.offload_optimizer else "none")
        rows.append(
            (
                str(i),
                t.framework or "megatron",
                str(lay.tp),
                str(lay.pp),
                str(lay.ep),
                str(lay.dp),
                _sched(lay.schedule, lay.vpp, lay.pp),
                split_words(lay),
                str(t.micro_batch),
                str(t.grad_accum),
                t.recompute,
                str(t.zero_stage),
                off,
                gib(c.peak_bytes),
                gib(c.headroom_bytes),
                "near" if c.near_limit else "",
                f"{c.step_time_s:.3f}",
                gib(c.host_bytes_per_node),
                c.phase,
            )
        )
    lines = [_summary(res)]
    lines += [f"warning: {w}" for w in res.warnings]
    if res.host_limited:
        lines.append(
            f"{res.host_limited} configs fit the GPU but not the host memory (the least needs "
            f"{gib(res.host_limited_bytes or 0)} GiB per node)"
        )
    if rows:
        lines += table(_HEADER, rows)
        lines += _bands(res)
        lines.append("dssup plan --explain N shows row N's step time term by term")
    elif res.closest is not None:
        lines.append(_closest(res, margin))
    return "\n".join(lines)


def _summary(res: PlanResult) -> str:
    where = f"on {res.topology.gpu} (micro x accum x dp = global batch in every row)"
    if not res.layouts_skipped:
        return (
            f"{res.fitting} of {res.evaluated} configs fit; fastest first by predicted step "
            f"time {where}"
        )
    return (
        f"fastest first by predicted step time {where}; the rows are the fastest of the whole "
        f"search: {res.layouts_swept} layouts swept ({res.fitting} of {res.evaluated} configs "
        f"fit), {res.layouts_skipped} skipped because a lower bound on their step time is "
        "slower than the last row (--exhaustive sweeps them all)"
    )


def _bands(res: PlanResult) -> list[str]:
    """The near-limit rule, once per band used."""
    seen: dict[tuple[float, str], list[str]] = {}
    for b in res.bands:
        seen.setdefault((b.fraction, b.source), []).append(b.framework)
    return [
        f"limit 'near': the peak is within {frac:.1%} of the GPU, the memory model's uncertainty "
        f"for {', '.join(fws)} ({source}); it fits by the model, by less than the model's error"
        for (frac, source), fws in seen.items()
    ]


def _sched(schedule: str, vpp: int, pp: int) -> str:
    if pp == 1:
        return "-"
    return f"vpp{vpp}" if schedule == "interleaved" else schedule


def _closest(res: PlanResult, margin: float) -> str:
    """Name whether the closest config misses the GPU itself or only the kept-free margin."""
    c = res.closest
    assert c is not None  # checked by the caller; not input validation
    lay = c.layout
    what = (
        f"{c.training.framework or 'megatron'} tp {lay.tp} pp {lay.pp} ep {lay.ep} split "
        f"{split_words(lay)} micro {c.training.micro_batch} recompute {c.training.recompute} "
        f"zero {c.training.zero_stage} needs {gib(c.peak_bytes)} GiB"
    )
    if res.closest_fits_gpu:
        gpu = c.peak_bytes + c.headroom_bytes
        need = max(0.0, 1 - c.peak_bytes / gpu)
        return (
            f"nothing fits with the {margin:.0%} margin; closest: {what}, which fits the GPU "
            f"({gib(c.headroom_bytes)} GiB free) but not the margin: --margin "
            f"{int(need * 1000) / 1000:g} would admit it"
        )
    return f"nothing fits the GPU; closest: {what} ({gib(-c.headroom_bytes)} GiB over the GPU)"
