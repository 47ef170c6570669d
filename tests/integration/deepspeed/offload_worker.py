"""Counts the bytes a real DeepSpeed engine keeps per parameter in each offload buffer.

Run by ``test_offload_vs_deepspeed.py`` under torchrun with ``DS_ACCELERATOR=cpu``: the
accelerator is the CPU too, so buffers are told apart by the optimizer attribute that holds them
(the names ``dssup/memory/offload.py`` cites), not by device. Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json

import deepspeed
import torch
from torch import nn


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def count(stage: int, offload_params: bool, accum: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.Linear(256, 64))
    n = sum(p.numel() for p in model.parameters())
    zero: dict[str, object] = {
        "stage": stage,
        "contiguous_gradients": True,
        "overlap_comm": False,
        "reduce_bucket_size": 4096,
        "allgather_bucket_size": 4096,
        "offload_optimizer": {"device": "cpu"},
    }
    if offload_params:
        zero["offload_param"] = {"device": "cpu"}
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": accum,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,  # torch AdamW: no C++ op to build on CPU
        "zero_allow_untested_optimizer": True,
    }
    engine, opt, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config
    )
    for _ in range(accum + (1 if accum > 1 else 0)):  # one step, then a micro-step short of one
        loss = engine(torch.randn(2, 256, dtype=torch.bfloat16)).float().square().mean()
        engine.backward(loss)
        engine.step()
    moments = sum(
        _bytes(s.get("exp_avg")) + _bytes(s.get("exp_avg_sq")) for s in opt.optimizer.state.values()
    )
    out = {"moments": moments}
    if stage == 3:
        fp32 = opt.fp32_partitioned_groups_flat
        out |= {
            "grad_buffer": _bytes(opt.grad_partitions_flat_buffer),
            "fp32_master": sum(_bytes(t) for t in fp32),
            "fp32_grads": sum(_bytes(t.grad) for t in fp32),
            "params_on_host": sum(
                _bytes(t) for t in getattr(opt, "param_groups_fp16_flat_cpu_memory", [])
            ),
        }
    else:
        fp32 = opt.single_partition_of_fp32_groups
        out |= {
            "fp32_master": sum(_bytes(t) for t in fp32),
            "fp32_grads": sum(_bytes(t.grad) for t in fp32),
            "accumulation_copy": sum(_bytes(t) for t in opt.accumulated_grads_in_cpu.values()),
        }
    return {k: v / n for k, v in out.items()}


if __name__ == "__main__":
    res = {
        "zero3": count(3, False, 1),
        "zero3_params": count(3, True, 1),
        "zero2_accum": count(2, False, 2),
    }
    print("RESULT " + json.dumps(res), flush=True)
