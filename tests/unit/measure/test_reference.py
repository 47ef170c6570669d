"""The reference model and the measurement harness: sizes, MoE routing, sources agreeing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from bench.accuracy_configs import MODELS  # noqa: E402
from dssup.memory import MLASpec, ModelSpec, MoESpec  # noqa: E402
from dssup.memory.params import model_total  # noqa: E402
from dssup.runtime.reference import RunSpec, build_model  # noqa: E402
from dssup.runtime.reference.crosscheck import profiler_peak  # noqa: E402
from dssup.runtime.reference.measure import measure  # noqa: E402
from dssup.runtime.reference.moe import MoE  # noqa: E402

pytestmark = pytest.mark.torch

TINY = ModelSpec(
    name="tiny", hidden=64, ffn=160, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=512
)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_count_equals_the_memory_models(name: str) -> None:
    spec = MODELS[name]
    with FakeTensorMode():
        model = build_model(RunSpec(model=spec, seq_len=64))
        n = sum(p.numel() for p in model.parameters())
    assert n == model_total(spec, "megatron", mtp=True)


def _moe(cf: float, routing: str) -> MoE:
    spec = TINY.model_copy(
        update={"moe": MoESpec(n_routed=4, n_shared=1, top_k=2, expert_ffn=32, shared_ffn=32)}
    )
    torch.manual_seed(0)
    return MoE(spec, routing, cf)


def test_capacity_routing_equals_dropless_when_nothing_overflows() -> None:
    x = torch.randn(2, 16, 64)
    capped, dropless = _moe(4.0, "capacity"), _moe(4.0, "dropless")  # cf = E/k: no drops
    dropless.load_state_dict(capped.state_dict())
    torch.testing.assert_close(capped(x), dropless(x))


def test_tight_capacity_drops_token_slots() -> None:
    x = torch.randn(2, 16, 64)
    tight, dropless = _moe(1.0, "capacity"), _moe(1.0, "dropless")
    dropless.load_state_dict(tight.state_dict())
    assert not torch.allclose(tight(x), dropless(x))


def test_mla_without_q_compression_and_tied_embeddings_run() -> None:
    mla = MLASpec(
        q_lora_rank=0, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16
    )
    spec = TINY.model_copy(update={"attention": "mla", "mla": mla, "tie_embeddings": True})
    model = build_model(RunSpec(model=spec, seq_len=32))
    loss = model(torch.randint(0, 512, (2, 32)))
    loss.backward()
    assert sum(p.numel() for p in model.parameters()) == model_total(spec, "megatron")


def test_profiler_source_counts_exact_bytes() -> None:
    with profiler_peak() as prof:
        a = torch.empty(1000, dtype=torch.float32)
        b = torch.empty(500, dtype=torch.float64)
        del a
        c = torch.empty(100, dtype=torch.uint8)
        del b, c
    assert prof.peak() == 4000 + 4000


@pytest.mark.parametrize(
    ("b", "phase"), [(1, "optimizer"), (16, "backward")], ids=["small-b", "large-b"]
)
def test_real_equals_fake_and_profiler_and_phase_moves(b: int, phase: str) -> None:
    run = RunSpec(model=TINY, micro_batch=b, seq_len=64, dtype="fp32", optimizer="foreach")
    real, fake = measure(run, "real"), measure(run, "fake")
    assert real.profiler_peak_bytes is not None
    assert abs(real.profiler_peak_bytes - real.peak_bytes) <= 4096
    assert real.peak_bytes == fake.peak_bytes
    assert real.phase == phase
    assert real.breakdown["Total"] == real.peak_bytes
