"""Flags that describe the machine a plan's step times are for, and the job's compute settings
(``--gpus-per-node`` and ``--host-memory`` are the model options', shared with estimate).

Every figure defaults to the GPU table's entry for the GPU (its reference node: DGX H100, HGX
H800, ...); each flag overrides one figure, and ``dssup plan`` prints every figure with where it
came from, so a ranking never rests on a number the user cannot see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from dssup.cli.values import Choice, Real, Whole
from dssup.errors import ConfigError
from dssup.memory.cost import CostModel
from dssup.memory.gpus import find_gpu
from dssup.memory.topology import Topology, default_topology, topology_for

__all__ = ["build_cost", "build_topology", "hardware_options"]

F = TypeVar("F", bound=Callable[..., Any])

_FIGURES: list[tuple[str, str, str, float]] = [
    # flag, Topology field, help, multiplier to the field's unit
    ("--bf16-tflops", "bf16_flops", "Dense BF16 tensor TFLOP/s per GPU.", 1e12),
    ("--fp8-tflops", "fp8_flops", "Dense FP8 tensor TFLOP/s per GPU.", 1e12),
    ("--hbm-tbs", "hbm_bytes_per_s", "Device memory bandwidth, TB/s.", 1e12),
    (
        "--nvlink-gbs",
        "intra_node_bytes_per_s",
        "GPU-to-GPU link in a node, GB/s per direction.",
        1e9,
    ),
    ("--nic-gbit", "inter_node_bytes_per_s", "Network per GPU, Gb/s (400 for NDR).", 1e9 / 8),
    ("--pcie-gbs", "host_bytes_per_s", "GPU <-> host link, GB/s per direction.", 1e9),
]


def hardware_options(fn: F) -> F:
    """Add the hardware and compute flags to a command."""
    opts = [
        click.option(
            "--gpu",
            "gpu_name",
            default=None,
            help="GPU whose reference node the step times are for (dssup gpus lists them). "
            "Default: the GPU --gpu-memory names.",
        ),
        click.option(
            "--host-cores",
            type=Whole(1, 1 << 16),
            default=None,
            help="Physical CPU cores per node (CPU Adam speed under optimizer offload).",
        ),
        *[
            click.option(flag, type=Real(0.0, 1e9, lo_open=True), default=None, help=h)
            for flag, _, h, _ in _FIGURES
        ],
        click.option(
            "--compute-dtype",
            type=Choice(["bf16", "fp8"]),
            default="bf16",
            show_default=True,
            help="GEMM precision of the job (fp8: TransformerEngine/DeepSeek FP8 GEMMs).",
        ),
        click.option(
            "--ep-overlap",
            is_flag=True,
            help="The expert all-to-all runs behind another micro-batch's compute (Megatron "
            "--overlap-moe-expert-parallel-comm); DualPipe always does.",
        ),
        click.option(
            "--ep-dispatch",
            type=Choice(["alltoall", "dedup"]),
            default="alltoall",
            show_default=True,
            help="Expert dispatch: one copy per (token, expert), or one per (token, node) across "
            "nodes (DeepEP, HybridEP).",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _key(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def build_topology(o: dict[str, Any]) -> tuple[Topology, list[str]]:
    """The topology from ``--gpu`` (or the GPU ``--gpu-memory`` names) and the override flags."""
    overrides: dict[str, float | int | None] = {
        "gpus_per_node": o.get("gpus_per_node"),
        "host_cpu_cores": o.get("host_cores"),
    }
    for flag, field, _, unit in _FIGURES:
        value = o.get(_key(flag))
        overrides[field] = None if value is None else value * unit
    name = o.get("gpu_name")
    field = "--gpu"
    if not name and o.get("gpu_memory"):
        name, field = o["gpu_memory"], "--gpu-memory"
    spec = find_gpu(name, field) if name else None
    if name and spec is None and field == "--gpu":
        raise ConfigError("--gpu", f"unknown GPU {name!r}", "dssup gpus lists the known names")
    if spec is None:
        topo = default_topology()
        given = {k: v for k, v in overrides.items() if v is not None}
        if given:
            topo = topo.model_copy(
                update={
                    **given,
                    "sources": {**topo.sources, **{k: "set on the command line" for k in given}},
                }
            )
        return topo, [
            f"no GPU named (--gpu-memory is a size): step times are for {topo.gpu}'s reference "
            "node; pass --gpu NAME for yours"
        ]
    return topology_for(spec, **overrides)


def build_cost(o: dict[str, Any]) -> CostModel:
    return CostModel(
        compute_dtype=o["compute_dtype"],
        ep_dispatch=o["ep_dispatch"],
        ep_overlap=bool(o.get("ep_overlap")),
    )
