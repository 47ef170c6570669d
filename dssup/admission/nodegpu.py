"""The GPU a Node carries, read from the labels its vendor's labeller writes.

NVIDIA GPU Feature Discovery writes ``nvidia.com/gpu.product`` (the nvidia-smi name, dashes for
spaces), ``nvidia.com/gpu.memory`` (MiB as NVML reports it) and ``nvidia.com/gpu.replicas``
(time-slicing). AMD's ROCm node labeller (ROCm/k8s-device-plugin, cmd/k8s-node-labeller/main.go
@ ed7646843003) writes, when every GPU of the node is the same, ``amd.com/gpu.product-name`` (the
sysfs product name, spaces as underscores, parentheses dropped) and ``amd.com/gpu.vram``: the
VRAM in whole GiB, rounded (``math.Round(MiB / 1024)``, e.g. ``192G`` on an MI300X), plus the
same values under ``beta.amd.com/`` and counters such as ``beta.amd.com/gpu.vram.192G: "8"``.

A rounded GiB only says the memory lies within half a GiB of it, so the figure taken is the
lower end (``N`` GiB - 512 MiB), unless dssup's GPU table knows the product and its driver figure
rounds to the same ``N`` (then that figure: exact, and inside the label's range). A node whose
GPUs differ gets only counters (``amd.com/gpu.product-name.<name>: "2"``) and no single value;
dssup does not pick one of them, so such a node names no product.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import NamedTuple

from dssup.memory.gpus import gpu_for_product

__all__ = [
    "AMD_PRODUCT_LABEL",
    "AMD_VRAM_LABEL",
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "GPU_REPLICAS_LABEL",
    "NodeGpu",
    "amd_vram_mib",
    "node_gpu",
]

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
AMD_PRODUCT_LABEL = "amd.com/gpu.product-name"
AMD_VRAM_LABEL = "amd.com/gpu.vram"
_AMD_BETA = "beta."
_GIB = re.compile(r"^([0-9]{1,7})G$")
MIB_PER_GIB = 1024


class NodeGpu(NamedTuple):
    """The GPU product of a Node, one GPU's memory in MiB (0: not labelled), time-slicing."""

    product: str
    memory_mib: int
    replicas: int


def _digits(value: object, default: int) -> int:
    text = str(value or "").strip()
    return int(text) if text.isascii() and text.isdigit() else default


def _amd(labels: Mapping[str, str], key: str) -> str:
    """A labeller value under ``amd.com/`` or, from older labellers, ``beta.amd.com/``."""
    return str(labels.get(key) or labels.get(_AMD_BETA + key) or "").strip()


def amd_vram_mib(value: str, product: str = "") -> int:
    """MiB of one GPU from the labeller's rounded ``<N>G`` (see the module docstring); 0 when
    the value is not of that form."""
    m = _GIB.match(value.strip())
    if m is None or int(m.group(1)) == 0:
        return 0
    gib = int(m.group(1))
    spec = gpu_for_product(product) if product else None
    if spec is not None and math.floor(spec.memory_mib / MIB_PER_GIB + 0.5) == gib:  # Go's Round
        return spec.memory_mib
    return gib * MIB_PER_GIB - MIB_PER_GIB // 2


def node_gpu(labels: Mapping[str, str]) -> NodeGpu | None:
    """The GPU the labels describe (GFD first, then the ROCm labeller), None for a Node
    without GPU labels or with GPUs of several kinds."""
    product = str(labels.get(GPU_PRODUCT_LABEL, "")).strip()
    if product:
        memory = _digits(labels.get(GPU_MEMORY_LABEL), 0)
        return NodeGpu(product, memory, max(1, _digits(labels.get(GPU_REPLICAS_LABEL), 1)))
    product = _amd(labels, AMD_PRODUCT_LABEL)
    if product:
        return NodeGpu(product, amd_vram_mib(_amd(labels, AMD_VRAM_LABEL), product), 1)
    return None
