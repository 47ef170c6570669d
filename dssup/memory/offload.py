"""Offload the way DeepSpeed 0.19.8 does it: what stays on the GPU, what lives on the host.

Read from ``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py`` (``self.device`` is
``cpu`` once the optimizer is offloaded; every buffer below is allocated on it):

ZeRO 1/2 with ``offload_optimizer``: the GPU keeps the 16-bit weights and the reduce (IPG)
buckets; reduced gradients are copied straight into the host's FP32 gradient partition
(``single_partition_of_fp32_groups[i].grad``), the FP32 master partition and the Adam moments
live there too, and the update runs on the host (DeepSpeedCPUAdam). With gradient accumulation a
16-bit copy of the rank's gradients is kept on the host between micro-steps
(``accumulated_grads_in_cpu``). ZeRO 1 reduces only at the boundary, so the full 16-bit
gradients stay on the GPU until then.

ZeRO 3 with ``offload_optimizer``: the gradient partitions are accumulated in a host buffer in
the gradient dtype (``grad_partitions_flat_buffer``), copied into FP32 gradient buffers per
sub-group (``fp32_partitioned_groups_flat[i].grad``) next to the FP32 master and the moments.
``offload_param`` adds the 16-bit parameter partition on the host; the GPU then holds only the
gathered working set (``core.py``).

Without offload the optimizer step makes an FP32 copy of the gradient partition on the GPU
(ZeRO 1/2: the whole partition; ZeRO 3: one sub-group of ``sub_group_size`` elements at a time).

Host memory at start: frameworks that build the model on the host in every process before
partitioning it (Hugging Face ``from_pretrained`` + DeepSpeed ZeRO 1/2) hold the whole model once
per process; ``deepspeed.zero.Init`` (ZeRO 3) holds one layer at a time. DeepSpeed's estimator
counts this in FP32; dssup counts it only when the load dtype is given (``host_load_bytes``).
"""

from __future__ import annotations

import math

from dssup.memory.config import Convention, Overheads, Precision, Training

__all__ = [
    "FP32",
    "HOST_TERMS",
    "host_at_start",
    "host_states",
    "host_terms",
    "offload_assumptions",
    "with_overhead",
]

FP32 = 4


# What each host term is, in a few words (keys are the JSON's ``host_terms``): the one label
# table the CLI's table and the admission answer both print.
HOST_TERMS = {
    "optimizer_states": "optimizer offload (FP32 master + Adam moments)",
    "fp32_gradients": "FP32 gradient partition",
    "gradient_buffer": "gradient buffer",
    "parameters": "parameter offload",
    "optimizer_step": "optimizer step",
    "pinned_buffers": "pinned buffers and allocator",
}


def host_terms(
    shard: int,
    zero: int,
    p: Precision,
    offload_optimizer: bool,
    offload_params: bool,
    grad_accum: int,
) -> dict[str, int]:
    """Exact bytes of offloaded states one rank keeps on the host, by term (before
    ``host_overhead``; zero terms left out)."""
    out: dict[str, int] = {}
    if offload_optimizer:
        out["optimizer_states"] = p.optimizer * shard
        if p.master:  # no master: the gradient partition is the optimizer's input
            out["fp32_gradients"] = FP32 * shard
        if zero >= 3:
            out["gradient_buffer"] = p.gradients * shard  # grad_partitions_flat_buffer
        elif grad_accum > 1:
            out["gradient_buffer"] = p.weights * shard  # accumulated_grads_in_cpu
    if offload_params:
        out["parameters"] = p.weights * shard
    return {k: v for k, v in out.items() if v}


def host_states(
    shard: int,
    zero: int,
    p: Precision,
    offload_optimizer: bool,
    offload_params: bool,
    grad_accum: int,
) -> int:
    """Exact bytes of offloaded states one rank keeps on the host (before ``host_overhead``)."""
    return sum(host_terms(shard, zero, p, offload_optimizer, offload_params, grad_accum).values())


def host_at_start(full: int, largest_layer: int, zero: int, load_bytes: int) -> int:
    """Bytes one process holds on the host while the model is built (``load_bytes`` per
    parameter; 0 = not counted): the whole model, or one layer under ``zero.Init`` (ZeRO 3)."""
    return load_bytes * (largest_layer if zero >= 3 else full)


def with_overhead(exact: int, fraction: float) -> int:
    """Host bytes including the named overhead fraction (pinned staging, allocator, process)."""
    return math.ceil(exact * (1.0 + fraction))


def offload_assumptions(
    conv: Convention, t: Training, ov: Overheads, gpus_per_node: int | None
) -> list[str]:
    """The lines an estimate prints about offload and host memory (only those that apply)."""
    if conv == "paper":
        return (
            ["optimizer offload: master weights and Adam moments in host memory"]
            if t.offload_optimizer
            else []
        )
    out = []
    if t.offload_optimizer:
        grads = (
            "keeps the full 16-bit gradients until the step"
            if t.zero_stage < 2
            else ("keeps only the reduce buckets of the gradients")
        )
        out.append(
            "optimizer offload as in DeepSpeed 0.19.8: FP32 master, Adam moments and FP32 "
            "gradient partitions on the host (ZeRO 3: also the gradient buffer; ZeRO 1/2 with "
            f"accumulation: a 16-bit gradient copy); the GPU {grads}; the update runs on the host"
        )
    if t.offload_params:
        out.append("parameter offload: the 16-bit parameter partition lives on the host")
    if t.offload_optimizer or t.offload_params:
        out.append(
            f"host memory: offloaded states + {ov.host_overhead:.0%} (DeepSpeed's estimator "
            "adds 50%: additional_buffer_factor 1.5)"
        )
    elif t.zero_stage == 3:
        out.append(
            f"ZeRO-3 optimizer step: FP32 gradient copy of one sub-group ({ov.zero3_sub_group:,} "
            "elements) at a time"
        )
    if gpus_per_node is not None:
        load = (
            f"{ov.host_load_bytes} B/param in every process before partitioning (ZeRO 3: one "
            "layer, zero.Init)"
            if ov.host_load_bytes
            else "not counted (the model is built on the GPU; --host-load-dtype fp32|bf16 for "
            "frameworks that build it on the host in every process)"
        )
        out.append(f"host per node: {gpus_per_node} GPUs share it; model build on the host {load}")
    return out
