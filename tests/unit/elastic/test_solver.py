"""The global-batch solver against brute force, and its memory columns against the planner."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dssup.elastic import ElasticRequest, MemoryContext, NodeRange, divisors, solve, splits
from dssup.errors import ConfigError
from dssup.memory import GiB, Layout, Training, estimate, preset


def brute_force(req: ElasticRequest) -> dict[int, set[tuple[int, int]]]:
    """Every (micro, accum) per node count by plain enumeration: no divisor tricks."""
    out: dict[int, set[tuple[int, int]]] = {}
    for n in range(req.nodes.min_nodes, req.nodes.max_nodes + 1):
        world = n * req.nproc_per_node
        pairs: set[tuple[int, int]] = set()
        if world % req.model_parallel == 0:
            dp = world // req.model_parallel
            for mb in range(1, req.global_batch + 1):
                if req.max_micro_batch is not None and mb > req.max_micro_batch:
                    continue
                if req.micro_batches is not None and mb not in req.micro_batches:
                    continue
                for gas in range(1, req.global_batch // mb + 1):
                    if mb * gas * dp == req.global_batch:
                        pairs.add((mb, gas))
        out[n] = pairs
    return out


requests = st.builds(
    ElasticRequest,
    global_batch=st.integers(1, 600),
    nodes=st.tuples(st.integers(1, 12), st.integers(0, 12)).map(
        lambda t: NodeRange(min_nodes=t[0], max_nodes=t[0] + t[1])
    ),
    nproc_per_node=st.sampled_from([1, 2, 3, 4, 8]),
    model_parallel=st.sampled_from([1, 2, 4, 8]),
    micro_batches=st.none() | st.lists(st.integers(1, 64), max_size=5).map(tuple),
    max_micro_batch=st.none() | st.integers(1, 64),
)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_table_matches_brute_force(req: ElasticRequest) -> None:
    table = solve(req)
    expected = brute_force(req)
    assert [r.nnodes for r in table.rows] == list(expected)
    for row in table.rows:
        got = {(s.micro_batch, s.grad_accum) for s in row.splits}
        assert got == expected[row.nnodes], row
        assert row.compatible == bool(got)
        assert row.compatible or row.reason


@settings(max_examples=300, deadline=None)
@given(requests)
def test_every_listed_plan_keeps_the_global_batch(req: ElasticRequest) -> None:
    for row in solve(req).rows:
        for s in row.splits:
            assert row.dp is not None
            assert s.micro_batch * s.grad_accum * row.dp == req.global_batch
            assert row.dp * req.model_parallel == row.world_size


def test_the_deepspeed_counterexample() -> None:
    """DeepSpeed picks 840 for mb [1,2,4,8] on 8-64 GPUs; 1024 keeps 8, 16, 32 and 64."""
    req = ElasticRequest(
        global_batch=1024,
        nodes=NodeRange.parse("8:64"),
        micro_batches=(1, 2, 4, 8),
    )
    table = solve(req)
    assert table.compatible_nnodes == [8, 16, 32, 64]
    assert [(s.micro_batch, s.grad_accum) for s in table.row(64).splits] == [
        (1, 16),
        (2, 8),
        (4, 4),
        (8, 2),
    ]
    assert "does not divide" in table.row(10).reason


@given(st.integers(1, 5000))
def test_divisors_are_exactly_the_divisors(n: int) -> None:
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize(("text", "low", "high"), [("4:16", 4, 16), ("8", 8, 8), (" 1 : 2 ", 1, 2)])
def test_node_range_parses(text: str, low: int, high: int) -> None:
    r = NodeRange.parse(text)
    assert (r.min_nodes, r.max_nodes) == (low, high)
    assert str(NodeRange.parse(str(r))) == str(r)


@pytest.mark.parametrize("text", ["", "a:b", "16:4", "0:2", "1:2:3", "-1"])
def test_node_range_rejects_nonsense(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        NodeRange.parse(text)
    assert info.value.field == "nnodes"


def test_splits_empty_when_dp_does_not_divide() -> None:
    assert splits(1024, 3) == []
    assert [s.micro_batch for s in splits(12, 1, max_micro_batch=4)] == [1, 2, 3, 4]


def _ctx(gpu: int) -> MemoryContext:
    return MemoryContext(
        model=preset("llama-3-8b"), base=Training(seq_len=4096), gpu_memory_bytes=gpu
    )


def test_memory_columns_agree_with_estimate() -> None:
    """Every fitting micro-batch re-estimates under the budget; the others never fit at any
    stage/recompute/offload (checked by estimating the lightest knob setting)."""
    ctx = _ctx(40 * GiB)
    req = ElasticRequest(global_batch=256, nodes=NodeRange.parse("2:8"), nproc_per_node=8)
    table = solve(req, ctx, {"A100-40GB": 40 * GiB, "H100": 80 * GiB})
    for row in table.rows:
        assert len(row.memory) == (2 if row.compatible else 0)
        for fit in row.memory:
            sized = ctx.model_copy(update={"gpu_memory_bytes": fit.memory_bytes})
            assert fit.best is not None
            assert fit.best.plan.world_size == row.world_size
            assert sized.peak(fit.best.plan) == fit.best.peak_bytes <= sized.budget
            for s in row.splits:
                lightest = Training(
                    seq_len=4096,
                    micro_batch=s.micro_batch,
                    grad_accum=s.grad_accum,
                    recompute="full",
                    zero_stage=3,
                    offload_optimizer=True,
                    offload_params=True,
                )
                peak = estimate(
                    ctx.model, Layout(dp=row.dp or 1), lightest, ctx.overheads
                ).peak_bytes
                if s.micro_batch not in fit.fitting_micro_batches:
                    assert peak > sized.budget
    a100, h100 = table.row(2).memory
    assert set(a100.fitting_micro_batches) <= set(h100.fitting_micro_batches)


def test_memory_problem_is_data_not_an_exception() -> None:
    """TP 3 does not divide llama's heads: the row says so instead of raising."""
    ctx = _ctx(80 * GiB).model_copy(update={"layout": Layout(tp=3)})
    req = ElasticRequest(global_batch=96, nodes=NodeRange.parse("1:2"), nproc_per_node=3)
    table = solve(req, ctx, {"H100": 80 * GiB})
    assert table.request.model_parallel == 3
    fit = table.row(1).memory[0]
    assert fit.best is None and "tp" in fit.problem
