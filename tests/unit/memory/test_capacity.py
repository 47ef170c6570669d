"""What "fits" means (``capacity.py``): the memory CUDA can allocate, no default margin, and
the configs within the memory model's uncertainty of the limit flagged, not hidden."""

from __future__ import annotations

from dssup.memory import GiB, Layout, PlanRequest, Training, estimate, plan, preset
from dssup.memory.capacity import DEFAULT_MARGIN, band, budget, near_limit


def test_no_default_margin_and_one_budget_rule() -> None:
    assert DEFAULT_MARGIN == 0.0 and PlanRequest.model_fields["margin"].default == 0.0
    assert budget(80 * GiB, 0.0) == 80 * GiB and budget(80 * GiB, 0.25) == 60 * GiB


def test_bands_name_their_source() -> None:
    assert band("transformers").fraction == 0.024 and "accuracy.md" in band("transformers").source
    assert band("deepspeed").fraction == 0.108 and "DeepSpeed" in band("deepspeed").source
    for fw in ("megatron", "deepseek", None):
        assert band(fw).fraction == 0.05 and "not measured on a GPU" in band(fw).source
    assert band("megatron", traced=True).fraction == 0.02
    assert near_limit(96, 100, band("megatron")) and not near_limit(95, 100, band("megatron"))


def test_plan_and_estimate_flag_the_same_configs_near_the_limit() -> None:
    m = preset("llama-3-8b")
    t = Training(micro_batch=1, seq_len=4096, zero_stage=1)
    lay = Layout(dp=8)
    peak = estimate(m, lay, t).peak_bytes
    for gpu, near in ((int(peak / 0.97), True), (int(peak / 0.90), False)):
        est = estimate(m, lay, t, gpu_memory_bytes=gpu)
        assert est.fits and est.near_limit is near and est.uncertainty == 0.05
        req = PlanRequest(
            model=m,
            gpu_memory_bytes=gpu,
            global_batch=8,
            layout=lay,
            training=t,
            recompute=("none",),
            zero_stages=(1,),
            allow_offload=False,
            micro_batches=(1,),
        )
        res = plan(req)
        (row,) = res.candidates
        assert row.peak_bytes == peak and row.near_limit is near
        assert res.near_limit == int(near) and res.bands[0].fraction == 0.05
