"""The bounded planner sweep (``bound.py``): its first rows are the exhaustive sweep's, and its
lower bound is below the step time of every config the planner ranks."""

from __future__ import annotations

import pytest

from dssup import modelzoo
from dssup.memory import (
    Layout,
    PlanRequest,
    Precision,
    Training,
    bound,
    model_from_hf_config,
    plan,
    preset,
)
from dssup.memory.config import Overheads
from dssup.memory.core import prepare
from dssup.memory.cost import CostModel
from dssup.memory.curve import cost_at, make_curve
from dssup.memory.defaults import resolve
from dssup.memory.gpus import find_gpu, usable_memory
from dssup.memory.topology import topology_for


def _request(model: str, gpus: int, batch: int, gpu: str, **kw: object) -> PlanRequest:
    spec = find_gpu(gpu)
    assert spec is not None
    return PlanRequest(
        model=preset(model),
        gpu_memory_bytes=usable_memory(spec),
        global_batch=batch,
        world_size=gpus,
        training=Training(seq_len=4096, precision=kw.pop("precision", None)),  # type: ignore[arg-type]
        search_parallelism=True,
        search_splits=True,
        topology=topology_for(spec)[0],
        allow_offload=False,
        **kw,  # type: ignore[arg-type]
    )


def _rows(res: object) -> list[tuple[object, ...]]:
    return [
        (c.training.framework, c.layout, c.training, c.step_time_s, c.peak_bytes)
        for c in res.candidates  # type: ignore[attr-defined]
    ]


@pytest.mark.parametrize(
    ("model", "gpus", "batch", "gpu", "extra"),
    [
        ("mixtral-8x7b", 64, 256, "h100", {}),
        ("llama-3-70b", 64, 512, "h100", {"limit": 25}),
        (
            "deepseek-v3",
            256,
            2048,
            "h800",
            {
                "frameworks": ("megatron", "deepseek"),
                "precision": Precision(moments=2, cache_fp8=True),
                "cost": CostModel(compute_dtype="fp8"),
            },
        ),
    ],
)
def test_bounded_rows_are_the_exhaustive_rows(
    model: str, gpus: int, batch: int, gpu: str, extra: dict[str, object]
) -> None:
    req = _request(model, gpus, batch, gpu, **dict(extra))
    full = plan(req)
    fast = plan(req.model_copy(update={"bound": True}))
    assert _rows(fast) == _rows(full) and fast.candidates
    assert fast.layouts_skipped > 0 and full.layouts_skipped == 0
    assert fast.layouts_swept < full.layouts_swept and fast.evaluated < full.evaluated


def test_the_bound_is_below_every_config_of_its_layout() -> None:
    req = _request("mixtral-8x7b", 64, 256, "h100", limit=100_000)
    res = plan(req)
    r = resolve("megatron", req.training, Overheads())
    by_layout: dict[Layout, float] = {}
    for c in res.candidates:
        lay = c.layout
        if lay not in by_layout:
            rows = req.global_batch // lay.dp
            args = bound.FoldArgs(req.cost, res.topology, req.model, lay, 4096, "megatron", r, 1.0)
            lb = bound.layout_bound(args)
            micro = [b for b in range(1, rows + 1) if rows % b == 0]
            by_layout[lay] = bound.lower_bound(lb, micro, rows)
        assert by_layout[lay] <= c.step_time_s * (1 + 1e-12), (lay, c.step_time_s)
    assert len(by_layout) > 20


def test_the_bound_is_cost_at_of_the_folds_curve_without_data_parallel_terms() -> None:
    """``lower_bound`` reads only the no-recompute level of a layout (``layout_bound``); it is,
    to the bit, ``cost_at`` of the whole fold's no-recompute curve with every data-parallel
    and optimizer term zero, and ``device_params`` is the largest device ``prepare`` builds."""
    req = _request(
        "deepseek-v3",
        256,
        2048,
        "h800",
        frameworks=("megatron", "deepseek"),
        precision=Precision(moments=2, cache_fp8=True),
        cost=CostModel(compute_dtype="fp8", ep_dispatch="dedup"),
        limit=100_000,
    )
    res = plan(req)
    found = {(c.training.framework, c.layout): c.training for c in res.candidates}
    deepseek = req.training.model_copy(update={"framework": "deepseek"})
    for split in (None, (3, *(4,) * 14, 2), (2, *(4,) * 14, 3)):  # DualPipe fits no 256 GPUs
        for ep in (8, 64):
            lay = Layout(pp=16, ep=ep, dp=16, schedule="dualpipe", layers_per_stage=split)
            found["deepseek", lay] = deepseek
    for (_, lay), training in found.items():
        r = resolve("megatron", training, Overheads())
        args = bound.FoldArgs(req.cost, res.topology, req.model, lay, 4096, "megatron", r, 1.0)
        rows = req.global_batch // lay.dp
        micro = [b for b in range(1, rows + 1) if rows % b == 0]
        curve = make_curve(req.cost, bound.bound_fold(args), "none", 0.0, 0.0, 0.0, 0.0, 0.0)
        assert bound.lower_bound(bound.layout_bound(args), micro, rows) == min(
            cost_at(curve, b, rows // b) for b in micro
        )
        devices = prepare(req.model, lay, training, "megatron", r)
        assert (
            bound.device_params(req.model, lay, "megatron", r)
            == max(devices, key=lambda d: d.split.total).split
        )
    assert {lay.schedule for _, lay in found} == {"1f1b", "interleaved", "dualpipe"}
    assert len(found) > 30


@pytest.mark.parametrize("conv", ["megatron", "paper"])
def test_device_params_of_a_tied_embedding_are_prepares(conv: str) -> None:
    """Llama-3.2-1B ties its head to its embedding: DualPipe's ranks 0 and PP-1 (both ends, in
    either order), PP = 1 and the 1F1B and interleaved edge ranks hold what ``prepare`` adds
    up."""
    entry = modelzoo.find("meta-llama/Llama-3.2-1B")
    assert entry is not None
    m = model_from_hf_config(modelzoo.load_config(entry))
    assert m.tie_embeddings
    t = Training(seq_len=4096)
    r = resolve(conv, t, Overheads())  # type: ignore[arg-type]
    for lay in (
        Layout(pp=4, dp=2, schedule="dualpipe"),
        Layout(pp=4, dp=2, schedule="dualpipe", layers_per_stage=(3, 5, 5, 3)),
        Layout(tp=2, dp=4),
        Layout(pp=4, vpp=2, dp=2, schedule="interleaved"),
        Layout(tp=2, pp=2, dp=2),
    ):
        devices = prepare(m, lay, t, conv, r)  # type: ignore[arg-type]
        want = max(devices, key=lambda d: d.split.total).split
        assert bound.device_params(m, lay, conv, r) == want, lay  # type: ignore[arg-type]


def test_kept_holds_the_fastest_and_says_when_a_bound_cannot_enter() -> None:
    kept: bound.Kept[str] = bound.Kept(2)
    assert kept.threshold == float("inf")
    for seconds, name in ((3.0, "c"), (1.0, "a"), (2.0, "b"), (2.0, "b2"), (0.5, "z")):
        kept.offer(seconds, name)
    assert [x[2] for x in kept.ranked()] == ["z", "a"] and kept.threshold == 1.0
