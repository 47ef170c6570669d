"""dssup's model states against DeepSpeed itself: its estimator functions and a real engine.

1. DeepSpeed 0.19.8's ``estimate_zero2_model_states_mem_needs`` and
   ``estimate_zero3_model_states_mem_needs`` are called for Llama-3-8B and Llama-3-70B at 8 and 64
   GPUs (8 per node), ZeRO 2 and 3, offload none / optimizer / optimizer + parameters. Parameter
   counts and DeepSpeed's largest layer come from the transformers model built on the meta
   device (nothing allocated; DeepSpeed's own ``model_to_params`` dedups by ``data_ptr``, which is
   0 for every meta tensor, so only its largest-layer figure is used). dssup must agree within 5 %
   wherever the estimator counts what DeepSpeed's code holds; where it does not (docs/
   memory-model.md, "DeepSpeed's estimators"), the difference must be exactly the named buffer.
2. A real DeepSpeed engine (torchrun on CPU) is asked which buffers it keeps per parameter; the
   host bytes per parameter must be dssup's (this is what makes the differences in 1 facts).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dssup.memory import Layout, Overheads, Precision, Training, estimate, preset
from dssup.memory.offload import host_states
from tests.integration.deepspeed.ds_launch import needs_deepspeed, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, needs_deepspeed]

DS_BF16 = Precision(weights=2, gradients=2, master=4, moments=4)  # bf16, grad_accum_dtype unset
PER_NODE = 8
SUB_GROUP = 10**9  # DeepSpeed's sub_group_size default
# (zero, offload optimizer, offload parameters)
MODES = [(2, False, False), (2, True, False), (3, False, False), (3, True, False), (3, True, True)]


@pytest.fixture(scope="module")
def counts() -> dict[str, tuple[int, int]]:
    """(total parameters, DeepSpeed's largest layer) of the transformers models on meta."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from deepspeed.runtime.zero.stage3 import model_to_params

    out = {}
    for name in ("llama-3-8b", "llama-3-70b"):
        m = preset(name)
        cfg = transformers.LlamaConfig(
            hidden_size=m.hidden,
            intermediate_size=m.ffn,
            num_hidden_layers=m.layers,
            num_attention_heads=m.heads,
            num_key_value_heads=m.kv_heads,
            vocab_size=m.vocab,
            tie_word_embeddings=m.tie_embeddings,
        )
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(cfg)
        out[name] = (sum(p.numel() for p in model.parameters()), model_to_params(model)[1])
    return out


def _ours(name: str, gpus: int, zero: int, opt: bool, par: bool) -> tuple[int, int, int]:
    """(device model states at their peak, host per node, parameters per GPU shard)."""
    t = Training(
        seq_len=4096,
        zero_stage=zero,
        offload_optimizer=opt,
        offload_params=par,
        precision=DS_BF16,
    )
    ov = Overheads(host_load_bytes=4)  # DeepSpeed's estimator builds the model in FP32
    est = estimate(preset(name), Layout(dp=gpus), t, ov, gpus_per_node=PER_NODE)
    b = est.stages[0].bytes
    device = b.weights + b.gradients + b.optimizer + max(b.zero3_working_set, b.optimizer_transient)
    assert est.host_bytes_per_node is not None
    return device, est.host_bytes_per_node, -(-est.stages[0].params.total // gpus)


def _deepspeed(
    total: int, largest: int, gpus: int, zero: int, opt: bool, par: bool
) -> tuple[int, int]:
    """DeepSpeed's (cpu_mem per node, gpu_mem per GPU)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    nodes = gpus // PER_NODE
    if zero == 2:
        return estimate_zero2_model_states_mem_needs(total, PER_NODE, nodes, cpu_offload=opt)
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        total, largest, PER_NODE, nodes, cpu_offload=opt, cpu_offload_params=par
    )
    return cpu, gpu


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"zero{m[0]}-opt{int(m[1])}-par{int(m[2])}")
@pytest.mark.parametrize("gpus", [8, 64])
@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b"])
def test_model_states_agree_with_deepspeeds_estimator(
    counts: dict[str, tuple[int, int]], name: str, gpus: int, mode: tuple[int, bool, bool]
) -> None:
    zero, opt, par = mode
    total, largest = counts[name]
    device, host, shard = _ours(name, gpus, zero, opt, par)
    ds_cpu, ds_gpu = _deepspeed(total, largest, gpus, zero, opt, par)

    # Device. The estimator's ZeRO-3 without offload charges 18 B per shard parameter plus
    # 4 B per largest-layer parameter at once; DeepSpeed's code holds 16 B resident (16-bit
    # weights and gradients, FP32 master, two moments) and then either the gathered layer
    # (forward/backward) or the FP32 gradient copy of one sub-group (the step).
    if zero == 3 and not opt and shard > SUB_GROUP and abs(device / ds_gpu - 1) > 0.05:
        ws = 2 * 2 * largest  # the largest layer is above max_live: gathered whole, with its grad
        assert device == 16 * shard + max(ws, 4 * SUB_GROUP)
        assert ds_gpu == int(18 * total / gpus) + 4 * largest
    else:
        assert device == pytest.approx(ds_gpu, rel=0.05)

    # Host per node. ZeRO-3 optimizer offload: DeepSpeed 0.19.8 also keeps the 16-bit gradient
    # partitions on the host (grad_partitions_flat_buffer, counted in a real engine below), which
    # the estimator's 16 (18 with parameters) B per parameter leave out. ZeRO-2 offload: the
    # estimator multiplies the model build by all GPUs, not the GPUs of one node.
    if zero == 3 and opt:
        assert host == pytest.approx(ds_cpu * ((20 / 18) if par else (18 / 16)), rel=0.005)
    elif zero == 2 and opt and gpus > PER_NODE:
        one_node, _ = _deepspeed(total, largest, PER_NODE, zero, opt, par)
        assert host == pytest.approx(one_node, rel=0.05) and ds_cpu == one_node * gpus // PER_NODE
    else:
        assert host == pytest.approx(ds_cpu, rel=0.05)


@pytest.mark.slow  # a torchrun child with DeepSpeed on CPU: ~20 s
def test_a_real_engine_keeps_the_buffers_dssup_counts() -> None:
    out = torchrun(1, Path(__file__).with_name("offload_worker.py"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    per_param = json.loads(line.removeprefix("RESULT "))

    def ours(zero: int, par: bool, accum: int) -> int:
        return host_states(1, zero, DS_BF16, True, par, accum)

    z3 = per_param["zero3"]
    assert z3 == {
        "grad_buffer": 2.0,
        "fp32_master": 4.0,
        "fp32_grads": 4.0,
        "moments": 8.0,
        "params_on_host": 0.0,
    }
    assert sum(z3.values()) == ours(3, False, 1) == 18
    assert sum(per_param["zero3_params"].values()) == ours(3, True, 1) == 20
    z2 = per_param["zero2_accum"]
    assert z2["accumulation_copy"] == 2.0
    assert sum(z2.values()) == ours(2, False, 2) == 18
