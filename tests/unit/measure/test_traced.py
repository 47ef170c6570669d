"""The user's own model code: transformers models built from real configs, traced and measured.

The fake trace (what ``dssup calibrate --hf`` runs at full shapes) must equal the real,
allocating step (what ``dssup measure --hf`` runs) to the byte, with the phase of the peak; the
real step must agree with torch.profiler. Models: the tiny configs of the accuracy dataset
(bench/hf_models, published configs shrunk), with two layers to keep CI fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from dssup.errors import ConfigError  # noqa: E402
from dssup.runtime.traced import HFSource, Knobs, TracedRun  # noqa: E402
from dssup.runtime.traced.build import build  # noqa: E402
from dssup.runtime.traced.fakefix import cpu_fake_fixes  # noqa: E402
from dssup.runtime.traced.step import measure  # noqa: E402

pytestmark = pytest.mark.torch

MODELS = Path(__file__).resolve().parents[3] / "bench" / "hf_models"


def source(name: str, layers: int | None = None) -> HFSource:
    cfg = json.loads((MODELS / f"{name}.json").read_text())
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    return HFSource(config=cfg, path=name)


@pytest.mark.parametrize(
    ("name", "counts", "first_dense"),
    [
        ("deepseek-v3-tiny", {"dense": 1, "moe": 3}, 1),
        ("deepseek-v2-lite-tiny", {"dense": 1, "moe": 3}, 1),
        ("llama-gqa-tiny", {"dense": 4}, 4),
        ("mixtral-tiny", {"moe": 4}, 0),
        ("qwen2-moe-tiny", {"moe": 4}, 0),
    ],
)
def test_blocks_and_kinds_found_in_the_module_tree(
    name: str, counts: dict[str, int], first_dense: int
) -> None:
    with FakeTensorMode():
        job = build(TracedRun(source=source(name)))
    assert job.stack.path == "model.layers"
    assert job.stack.counts() == counts
    assert job.stack.first_dense() == first_dense
    text = job.stack.describe()
    assert ("first-k dense" in text) == (counts.get("moe", 0) > 0 and first_dense > 0), text
    assert "no MTP module" in text  # transformers builds no MTP even where the config asks


def test_a_reduced_model_keeps_the_chosen_blocks() -> None:
    with FakeTensorMode():
        job = build(TracedRun(source=source("deepseek-v3-tiny"), keep_blocks=(0, 2)))
        assert job.stack.kinds == ["dense", "moe"] and job.stack.indices == [0, 2]
        assert len(job.model.get_submodule("model.layers")) == 2


# Each model once, the knobs spread over them; micro-batch 4 x 64 tokens puts most peaks in
# backward, where activations (what a fake trace could get wrong) decide.
CASES = [
    ("deepseek-v3-tiny", Knobs(micro_batch=4, seq_len=64, dtype="bf16", attention="eager")),
    ("deepseek-v2-lite-tiny", Knobs(micro_batch=4, seq_len=64, dtype="fp32", checkpointing=True)),
    ("llama-gqa-tiny", Knobs(micro_batch=4, seq_len=64, dtype="amp", attention="eager")),
    ("mixtral-tiny", Knobs(micro_batch=4, seq_len=64, dtype="fp32", attention="sdpa")),
    ("qwen2-moe-tiny", Knobs(micro_batch=4, seq_len=64, dtype="amp", checkpointing=True)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "knobs"), CASES, ids=[c[0] for c in CASES])
def test_fake_trace_equals_the_real_step_and_the_profiler(name: str, knobs: Knobs) -> None:
    run = TracedRun(source=source(name, layers=2), knobs=knobs)
    real, fake = measure(run, "real"), measure(run, "fake")
    assert real.profiler_peak_bytes is not None
    assert abs(real.profiler_peak_bytes - real.peak_bytes) <= real.profiler_allowance_bytes
    assert fake.peak_bytes == real.peak_bytes
    assert (fake.phase, fake.step) == (real.phase, real.step)
    assert fake.phase_peaks == real.phase_peaks
    assert real.breakdown["Total"] == real.peak_bytes
    assert real.versions["transformers"] == "5.23.0"


def test_fp32_grouped_experts_need_the_cpu_rule() -> None:
    """torch 2.13's fake rule of ``_grouped_mm`` insists on bf16 (the CUDA kernel's contract);
    the CPU kernel takes fp32. When this test fails, torch's rule was fixed: drop the override
    in dssup/runtime/traced/fakefix.py."""
    offs = torch.tensor([4, 8], dtype=torch.int32)
    real = torch._grouped_mm(torch.randn(8, 16), torch.randn(2, 16, 4), offs=offs)
    assert real.shape == (8, 4) and real.dtype == torch.float32 and real.is_contiguous()
    with FakeTensorMode() as mode:
        a, w, o = torch.empty(8, 16), torch.empty(2, 16, 4), mode.from_tensor(offs)
        with pytest.raises(RuntimeError, match="BF16"):
            torch._grouped_mm(a, w, offs=o)
        with cpu_fake_fixes():
            fake = torch._grouped_mm(a, w, offs=o)
    assert (fake.shape, fake.dtype, fake.stride()) == (real.shape, real.dtype, real.stride())


def test_remote_code_models_are_refused_by_name() -> None:
    src = HFSource(config={"model_type": "my_private_arch", "vocab_size": 8}, path="x")
    with FakeTensorMode(), pytest.raises(ConfigError, match="--module"):
        build(TracedRun(source=src))
