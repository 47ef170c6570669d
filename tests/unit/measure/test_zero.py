"""The data-parallel harness: rank 0's slices, real sharding of updates and gradients, offload.

The process group is torch's fake one (one process plays rank 0; collectives are no-ops) and an
offloaded optimizer lives on the meta device: a real multi-rank job and a host/accelerator pair
cannot exist on this CPU-only machine (see ``dssup.runtime.reference.zero``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from dssup.memory import ModelSpec  # noqa: E402
from dssup.memory.zero import shard_sizes  # noqa: E402
from dssup.runtime.reference import RunSpec  # noqa: E402
from dssup.runtime.reference.measure import measure  # noqa: E402
from dssup.runtime.reference.zero import HOST, ShardedAdamW, fake_world, owned_slices  # noqa: E402

pytestmark = pytest.mark.torch

TINY = ModelSpec(
    name="tiny", hidden=64, ffn=160, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=512
)


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 5), nn.Linear(5, 3))  # 40 + 18 = 58 elements


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_slices_partition_the_elements_like_the_memory_model(world: int) -> None:
    params = list(_net().parameters())
    held = [sum(s.stop - s.start for s in owned_slices(params, r, world)) for r in range(world)]
    assert held == shard_sizes(58, world)
    covered = sorted(
        (id(s.param), i)
        for r in range(world)
        for s in owned_slices(params, r, world)
        for i in range(s.start, s.stop)
    )
    assert len(covered) == len(set(covered)) == 58  # every element exactly once


def _train(stage: int, offload: bool = False) -> tuple[nn.Sequential, ShardedAdamW, list[bool]]:
    """One step as rank 0 of 2; which flat elements changed."""
    net = _net()
    before = torch.cat([p.detach().flatten().clone() for p in net.parameters()])
    with fake_world(2):
        opt = ShardedAdamW(net, stage, offload, {"foreach": True})
        net(torch.ones(4, 7)).square().sum().backward()
        opt.step()
    after = torch.cat([p.detach().flatten() for p in net.parameters()])
    return net, opt, (after != before).tolist()


@pytest.mark.parametrize("stage", [1, 2])
def test_rank0_updates_only_its_own_half(stage: int) -> None:
    _, opt, changed = _train(stage)
    assert changed == [True] * 29 + [False] * 29  # the rest arrives by the (no-op) all-gather
    assert sum(s.numel() for s in opt.shards) == 29


def test_zero2_keeps_only_the_owned_gradient_slices() -> None:
    net, opt, _ = _train(2)
    assert all(p.grad is None for p in net.parameters())
    grads = [t.grad for t in opt.shards]
    assert [g.numel() for g in grads if g is not None] == [s.numel() for s in opt.shards]
    ref = _net()
    ref(torch.ones(4, 7)).square().sum().backward()
    assert ref[0].weight.grad is not None and grads[0] is not None
    assert torch.equal(grads[0], ref[0].weight.grad.flatten()[: grads[0].numel()])


def test_offloaded_optimizer_state_lives_on_the_host() -> None:
    net, opt, changed = _train(1, offload=True)
    assert all(t.device == HOST for t in opt.shards)
    moments = [v for st in opt.inner.state.values() for k, v in st.items() if k != "step"]
    assert moments and all(v.device == HOST for v in moments)  # AdamW's step count is a CPU scalar
    assert not any(changed)  # a meta master has no values to copy back
    assert all(p.grad is None for p in net.parameters())


def test_measured_device_bytes_shrink_with_each_stage_and_offload() -> None:
    """Real CPU steps, each cross-checked with torch.profiler inside ``measure``."""
    base = RunSpec(model=TINY, seq_len=32, recompute="full", steps=2, dp=2)
    peaks = [
        measure(base.model_copy(update=u)).peak_bytes
        for u in (
            {},
            {"zero_stage": 1},
            {"zero_stage": 2},
            {"zero_stage": 2, "offload_optimizer": True},
        )
    ]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4
