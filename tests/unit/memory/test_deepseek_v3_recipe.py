"""DeepSeek-V3 as DeepSeek trained it fits an 80 GB H800; without FP8 caching and DeepSeek's
recompute it does not.

The recipe, arXiv 2412.19437 (DeepSeek-V3 technical report): 2048 H800 GPUs, 16-way pipeline
parallelism with DualPipe, 64-way expert parallelism, ZeRO-1 data parallelism, no tensor
parallelism (section 3.2); BF16 Adam moments, FP32 master weights and gradients, FP8 caching of
linear-layer inputs and MoE SwiGLU inputs (section 3.3); recompute of every RMSNorm and the MLA
up-projections (section 3.2.3); sequence length 4096 and a batch that ramps from 3072 to 15360
sequences, then stays at 15360 (section 4.2) -- 15360 / DP 128 = 120 micro-batches of 1.
The layer split is not published; NVIDIA's Megatron-LM layout for a DeepSeek-V3-style stack
(docs/user-guide/features/pipeline_parallel_layout.md, PP16) puts the embedding and the three
dense layers on the first stage: 3, 4 x 14, 2. The GPU: ``totalGlobalMem`` of an H800 in
DeepSeek's own training trace (deepseek-ai/profile-data 4496024, train.json): 84,943,110,144 B.
"""

from __future__ import annotations

import pytest

from dssup.memory import Layout, PlanRequest, Precision, Training, estimate, plan, preset

H800 = 84_943_110_144
SPLIT = (3, *(4,) * 14, 2)
LAYOUT = Layout(tp=1, pp=16, ep=64, dp=128, schedule="dualpipe", layers_per_stage=SPLIT)
FP8_LOWMOM = Precision(moments=2, cache_fp8=True)
RECIPE = Training(
    micro_batch=1,
    seq_len=4096,
    grad_accum=15360 // 128,
    zero_stage=1,
    precision=FP8_LOWMOM,
    framework="deepseek",
    recompute="selective",
)


@pytest.fixture(scope="module")
def v3():
    return preset("deepseek-v3")


def test_recipe_fits_an_h800_with_per_device_rows(v3) -> None:
    est = estimate(v3, LAYOUT, RECIPE, gpu_memory_bytes=H800)
    assert est.fits is True, est.peak_bytes / 2**30
    assert est.schedule == "dualpipe" and est.framework == "deepseek"
    for i, row in enumerate(est.stages):
        assert [h.stage for h in row.held] == [i, 15 - i]
        assert [h.in_flight_micro_batches for h in row.held] == [16 - i, i + 1]
        assert row.bytes.in_flight_micro_batches == 17  # PP + 1 (Table 2)
    loss = [h for row in est.stages for h in row.held if h.head]
    assert [h.in_flight_micro_batches for h in loss] == [1, 1]  # logits of one micro-batch
    # Both stages' parameters on a device: device 1 holds stages 1 and 14 (4 MoE layers each).
    assert est.stages[1].params.total == 2 * est.stages[1].held[0].params.total


def test_without_fp8_caching_and_recompute_it_does_not_fit(v3) -> None:
    plain = RECIPE.model_copy(update={"precision": Precision(moments=2), "recompute": "none"})
    est = estimate(v3, LAYOUT, plain, gpu_memory_bytes=H800)
    assert est.fits is False
    assert est.peak_bytes > 1.5 * H800


def test_fp8_caching_changes_bytes(v3) -> None:
    bf16 = RECIPE.model_copy(update={"precision": Precision(moments=2)})
    a = estimate(v3, LAYOUT, RECIPE).stages[1].bytes.activations
    b = estimate(v3, LAYOUT, bf16).stages[1].bytes.activations
    assert a < 0.8 * b


def test_plan_lists_the_recipe_for_its_layout(v3) -> None:
    """``plan`` judges the fit against what CUDA can allocate and keeps no margin by default
    (context, buffers and fragmentation are terms of the model): the recipe, which leaves
    1.4 % of an H800, is listed and flagged near the limit; a user's 2 % margin leaves it out.
    Without the split and the framework (the planner searches both) it is listed too."""
    base = RECIPE.model_copy(update={"grad_accum": 1, "zero_stage": 0, "recompute": "none"})
    req = PlanRequest(
        model=v3,
        gpu_memory_bytes=H800,
        global_batch=15360,
        world_size=2048,
        layout=LAYOUT.model_copy(update={"dp": 1}),
        training=base,
        limit=1000,
    )
    want = (1, 120, "selective", 1, False, False)

    def rows(res):  # type: ignore[no-untyped-def]
        return {
            (
                c.training.micro_batch,
                c.training.grad_accum,
                c.training.recompute,
                c.training.zero_stage,
                c.training.offload_optimizer,
                c.training.offload_params,
            ): c
            for c in res.candidates
        }

    found = rows(plan(req))
    assert want in found and found[want].near_limit
    assert want not in rows(plan(req.model_copy(update={"margin": 0.02})))
    free = req.model_copy(
        update={
            "layout": LAYOUT.model_copy(update={"dp": 1, "layers_per_stage": None}),
            "training": base.model_copy(update={"framework": None}),
            "frameworks": ("megatron", "deepseek"),
            "search_splits": True,
        }
    )
    found = rows(plan(free))
    assert want in found and found[want].training.framework == "deepseek"
    assert found[want].layout.layers_per_stage is not None  # an uneven split, named
