"""GPU memory of the node type a job asks for: GFD node labels first, a built-in table second.

NVIDIA GPU Feature Discovery labels every GPU node with ``nvidia.com/gpu.product`` and
``nvidia.com/gpu.memory`` (MiB of one GPU, as NVML reports it). The watch cache of Nodes turns
those into a per-product figure (the smallest, to be safe); the table below covers clusters
without GFD and ``dssup admit`` run offline. A time-sliced GPU (``nvidia.com/gpu.replicas`` > 1)
shares its memory, so the usable share is divided. A configurable reserve is subtracted last.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from dssup.admission.cache import ClusterCache

__all__ = ["GPU_TABLE_MIB", "GpuMemory", "resolve_gpu"]

MiB = 1 << 20

# NVML totals (MiB) as GFD / nvidia-smi report them; keys are GFD product labels.
GPU_TABLE_MIB: dict[str, int] = {
    "Tesla-T4": 15360,
    "Tesla-V100-SXM2-16GB": 16384,
    "Tesla-V100-SXM2-32GB": 32768,
    "NVIDIA-A10": 23028,
    "NVIDIA-A10G": 23028,
    "NVIDIA-L4": 23034,
    "NVIDIA-L40S": 46068,
    "NVIDIA-A100-SXM4-40GB": 40960,
    "NVIDIA-A100-PCIE-40GB": 40960,
    "NVIDIA-A100-SXM4-80GB": 81920,
    "NVIDIA-A100-80GB-PCIe": 81920,
    "NVIDIA-A800-SXM4-80GB": 81920,
    "NVIDIA-H100-80GB-HBM3": 81559,
    "NVIDIA-H100-PCIe": 81559,
    "NVIDIA-H100-NVL": 95830,
    "NVIDIA-H800": 81559,
    "NVIDIA-H800-80GB-HBM3": 81559,
    "NVIDIA-H20": 97871,
    "NVIDIA-H200": 143771,
    "NVIDIA-H200-141GB-HBM3e": 143771,
    "NVIDIA-B200": 183359,
}
_MIG = re.compile(r"-MIG-\d+g\.(\d+)gb$", re.IGNORECASE)


class GpuMemory(NamedTuple):
    """Usable bytes of one GPU after the reserve, and where the figure came from."""

    product: str
    total_bytes: int
    usable_bytes: int
    source: str  # "node-labels" | "table" | "mig-name"
    shared_by: int = 1


def _table(product: str) -> tuple[int, str] | None:
    mib = GPU_TABLE_MIB.get(product)
    if mib is None:
        lowered = {k.lower(): v for k, v in GPU_TABLE_MIB.items()}
        mib = lowered.get(product.lower())
    if mib is not None:
        return mib, "table"
    mig = _MIG.search(product)
    if mig:
        return int(mig.group(1)) * 1024, "mig-name"
    return None


def resolve_gpu(
    products: tuple[str, ...], cache: ClusterCache, reserve_bytes: int
) -> GpuMemory | None:
    """The smallest usable GPU among ``products`` (a job may land on any of them)."""
    best: GpuMemory | None = None
    for product in products:
        info = cache.gpu_product(product)
        if info is not None:
            total, source, shared = info.memory_mib * MiB, "node-labels", info.replicas
        else:
            hit = _table(product)
            if hit is None:
                continue
            total, source, shared = hit[0] * MiB, hit[1], 1
        usable = max(0, total // shared - reserve_bytes)
        if best is None or usable < best.usable_bytes:
            best = GpuMemory(product, total, usable, source, shared)
    return best
