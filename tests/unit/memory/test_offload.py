"""Offload as DeepSpeed 0.19.8 does it, the host per node, and the host check.

Byte counts per parameter come from DeepSpeed's code (``dssup/memory/offload.py`` cites the
buffers); ``tests/integration/deepspeed/test_offload_vs_deepspeed.py`` counts them in a real
DeepSpeed engine and calls DeepSpeed's own estimators.
"""

from __future__ import annotations

import pytest

from dssup.errors import ConfigError
from dssup.memory import GiB, Layout, Overheads, PlanRequest, Precision, Training, estimate, plan
from dssup.memory import preset as load_preset
from dssup.memory.params import model_total

LLAMA = load_preset("llama-3-8b")
P = model_total(LLAMA, "megatron")
DS_BF16 = Precision(weights=2, gradients=2, master=4, moments=4)  # DeepSpeed bf16, its default
N = 8


def _est(zero: int, opt: bool, par: bool, accum: int = 1, **kw: object):  # type: ignore[no-untyped-def]
    t = Training(
        seq_len=1024,
        zero_stage=zero,
        offload_optimizer=opt,
        offload_params=par,
        grad_accum=accum,
        precision=DS_BF16,
    )
    ov = Overheads(host_overhead=0.0, **kw)  # type: ignore[arg-type]
    return estimate(LLAMA, Layout(dp=N), t, ov, gpus_per_node=N)


def _shard() -> int:
    return -(-P // N)


@pytest.mark.parametrize(
    ("zero", "par", "accum", "host_per_param", "device_grads"),
    [
        (2, False, 1, 16, 0),  # FP32 master + moments + FP32 gradient partition
        (2, False, 4, 18, 0),  # + the 16-bit accumulation copy between micro-steps
        (1, False, 1, 16, 2 * P),  # ZeRO 1 keeps the full 16-bit gradients until the step
        (3, False, 1, 18, 0),  # + grad_partitions_flat_buffer (16-bit) on the host
        (3, True, 1, 20, 0),  # + the 16-bit parameter partition
    ],
)
def test_optimizer_offload_moves_what_deepspeed_moves(
    zero: int, par: bool, accum: int, host_per_param: int, device_grads: int
) -> None:
    st = _est(zero, True, par, accum).stages[0]
    assert st.host_bytes == host_per_param * _shard()
    assert st.bytes.gradients == device_grads
    assert st.bytes.optimizer == 0 and st.bytes.optimizer_transient == 0
    assert st.bytes.weights == (0 if par else 2 * (P if zero < 3 else _shard()))


def test_zero3_step_copies_one_sub_group_and_gathers_whole_layers() -> None:
    one = _est(3, False, False, zero3_sub_group=10**8).stages[0].bytes
    assert one.optimizer_transient == 4 * 10**8  # not the whole 1e9-element partition
    largest = LLAMA.vocab * LLAMA.hidden  # the embedding, 525M parameters
    ov = Overheads()
    gathered = max(largest, min(ov.zero3_max_live_parameters, largest + ov.zero3_prefetch_bucket))
    assert one.zero3_working_set == 2 * (gathered + largest)
    capped = _est(3, False, False, zero3_max_live_parameters=10**8).stages[0].bytes
    assert capped.zero3_working_set == 2 * 2 * largest  # a layer is never gathered in part


def test_paper_convention_offload_is_unchanged() -> None:
    t = Training(seq_len=1024, zero_stage=3, offload_optimizer=True, offload_params=True)
    st = estimate(LLAMA, Layout(dp=N), t, convention="paper").stages[0]
    shard = -(-st.params.total // N)  # the paper counts no final norm
    assert st.host_bytes == (4 + 2 + 2) * shard + 2 * shard  # optimizer and weights moved
    assert st.bytes.gradients == 4 * shard  # the paper keeps gradients on the GPU
    assert st.host_init_bytes == 0


def test_host_per_node_and_the_host_check() -> None:
    t = Training(seq_len=1024, zero_stage=3, offload_optimizer=True, precision=DS_BF16)
    need = estimate(LLAMA, Layout(dp=N), t, gpus_per_node=N)
    per_gpu = need.stages[0].host_bytes
    assert per_gpu == -(-18 * _shard() * 3 // 2)  # 50% overhead, DeepSpeed's 1.5 factor
    assert need.host_bytes_per_node == N * per_gpu and need.fits is None
    small = estimate(LLAMA, Layout(dp=N), t, None, "megatron", 80 * GiB, 128 * GiB, N)
    assert small.headroom_bytes is not None and small.headroom_bytes > 0  # fits the GPU ...
    assert small.host_fits is False and small.fits is False  # ... not the host: does not fit
    big = estimate(LLAMA, Layout(dp=N), t, None, "megatron", 80 * GiB, 2048 * GiB, N)
    assert big.host_fits is True and big.fits is True
    with pytest.raises(ConfigError, match="gpus_per_node"):
        estimate(LLAMA, Layout(dp=N), t, host_memory_bytes=GiB)


def test_model_build_on_the_host_is_counted_only_when_given() -> None:
    plain = _est(2, False, False).stages[0]
    assert plain.host_bytes == 0 and plain.host_init_bytes == 0
    fp32 = _est(2, False, False, host_load_bytes=4).stages[0]
    assert fp32.host_init_bytes == 4 * P  # every process builds the whole model
    zero_init = _est(3, False, False, host_load_bytes=4).stages[0]
    assert zero_init.host_init_bytes == 4 * LLAMA.vocab * LLAMA.hidden  # one layer at a time


def test_planner_refuses_configs_the_host_cannot_hold() -> None:
    base = {
        "model": LLAMA,
        "gpu_memory_bytes": 24 * GiB,
        "global_batch": 64,
        "world_size": N,
        "training": Training(seq_len=1024, precision=DS_BF16),
        "zero_stages": (2, 3),
        "gpus_per_node": N,
    }
    free = plan(PlanRequest(**base))  # type: ignore[arg-type]
    assert free.candidates and free.host_limited == 0
    offloaded = [c for c in free.candidates if c.training.offload_optimizer]
    assert offloaded and all(c.host_bytes_per_node > 0 for c in offloaded)
    tight = plan(PlanRequest(**base, host_memory_bytes=64 * GiB))  # type: ignore[arg-type]
    assert tight.host_limited > 0 and tight.host_limited_bytes is not None
    assert tight.host_limited_bytes > 64 * GiB
    assert all(c.host_bytes_per_node <= 64 * GiB for c in tight.candidates)
    for c in tight.candidates[:5]:  # a planned config re-estimates to the same host bytes
        est = estimate(LLAMA, c.layout, c.training, gpus_per_node=N)
        assert est.host_bytes_per_node == c.host_bytes_per_node
