"""GPU memory of the node type a job asks for: GFD node labels first, a built-in table second.

NVIDIA GPU Feature Discovery labels every GPU node with ``nvidia.com/gpu.product`` and
``nvidia.com/gpu.memory`` (MiB of one GPU, as NVML reports it). The watch cache of Nodes turns
those into a per-product figure (the smallest, to be safe); dssup's one GPU table
(``dssup/memory/gpu_table.py``, the same figures the CLI and planner use) covers clusters
without GFD and ``dssup admit`` run offline. A time-sliced GPU (``nvidia.com/gpu.replicas`` > 1)
shares its memory, so the usable share is divided. A configurable reserve is subtracted last.
"""

from __future__ import annotations

from typing import NamedTuple

from dssup.admission.cache import ClusterCache
from dssup.memory.gpus import gpu_for_product, mig_memory_mib

__all__ = ["GpuMemory", "resolve_gpu"]

MiB = 1 << 20


class GpuMemory(NamedTuple):
    """Usable bytes of one GPU after the reserve, and where the figure came from."""

    product: str
    total_bytes: int
    usable_bytes: int
    source: str  # "node-labels" | "table" | "mig-name"
    shared_by: int = 1


def _table(product: str) -> tuple[int, str] | None:
    """MiB and source from dssup's one GPU table (``dssup.memory.gpus``), or a MIG slice's
    conservative memory from its profile name."""
    spec = gpu_for_product(product)
    if spec is not None:
        return spec.memory_mib, "table"
    mig = mig_memory_mib(product)
    return None if mig is None else (mig, "mig-name")


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
