"""The planner's shortcuts (cached stage kinds, early stop on micro-batch, the probe of the
least memory-hungry config) must decide exactly what estimating every config decides."""

from __future__ import annotations

import itertools

import pytest

from dssup.errors import ConfigError
from dssup.memory import GiB, Layout, PlanRequest, Training, estimate, plan, preset
from dssup.memory.validate import divisors


def brute_force(req: PlanRequest) -> tuple[int, int, int | None]:
    world = req.world_size or req.layout.world_size
    layout = req.layout.model_copy(
        update={"dp": world // (req.layout.tp * req.layout.pp * req.layout.cp)}
    )
    rows = req.global_batch // layout.dp
    budget = int(req.gpu_memory_bytes * (1 - req.margin))
    offloads = [(False, False), (True, False), (True, True)]
    evaluated = fitting = 0
    smallest_miss = None
    for zero, (oo, op), rc, b in itertools.product(
        req.zero_stages, offloads, req.recompute, divisors(rows)
    ):
        if op and zero != 3:
            continue
        t = req.training.model_copy(
            update={
                "micro_batch": b,
                "grad_accum": rows // b,
                "recompute": rc,
                "zero_stage": zero,
                "offload_optimizer": oo,
                "offload_params": op,
            }
        )
        try:
            peak = estimate(req.model, layout, t, convention=req.convention).peak_bytes
        except ConfigError:  # an accumulation the schedule refuses (DualPipe, interleaved)
            continue
        evaluated += 1
        if peak <= budget:
            fitting += 1
        elif smallest_miss is None or peak < smallest_miss:
            smallest_miss = peak
    return evaluated, fitting, smallest_miss


@pytest.mark.parametrize(
    ("name", "layout", "gib", "gbs"),
    [
        ("deepseek-v2-lite", Layout(tp=2, pp=3, ep=4, dp=4), 24, 64),
        ("deepseek-v2-lite", Layout(tp=1, pp=1, ep=8, dp=8), 40, 32),
        ("llama-3-8b", Layout(tp=2, pp=4, dp=2, schedule="interleaved", vpp=2), 16, 48),
        ("mixtral-8x7b", Layout(tp=2, pp=4, ep=4, dp=4, schedule="dualpipe"), 80, 128),
        ("deepseek-v2-lite", Layout(pp=3, vpp=3, ep=4, dp=4, schedule="interleaved"), 24, 96),
        ("deepseek-v2-lite", Layout(pp=4, ep=8, dp=8, schedule="dualpipe"), 16, 512),
        ("deepseek-v3", Layout(tp=2, pp=16, ep=8, dp=32), 80, 1024),
        ("deepseek-v3", Layout(tp=2, pp=16, ep=8, dp=32), 8, 1024),  # nothing fits
    ],
)
def test_planner_matches_brute_force(name: str, layout: Layout, gib: int, gbs: int) -> None:
    req = PlanRequest(
        model=preset(name),
        gpu_memory_bytes=gib * GiB,
        global_batch=gbs,
        world_size=layout.world_size,
        layout=layout,
        training=Training(seq_len=2048),
        limit=10_000,
    )
    res = plan(req)
    evaluated, fitting, smallest_miss = brute_force(req)
    assert (res.evaluated, res.fitting) == (evaluated, fitting)
    assert len(res.candidates) == fitting
    if fitting == 0:
        assert res.closest is not None and res.closest.peak_bytes == smallest_miss
