"""GPU memory of the node type a job asks for: GFD node labels first, a built-in table second.

NVIDIA GPU Feature Discovery labels every GPU node with ``nvidia.com/gpu.product`` and
``nvidia.com/gpu.memory`` (MiB of one GPU, as NVML reports it). The watch cache of Nodes turns
those into a per-product figure (the smallest, to be safe); dssup's one GPU table
(``dssup/memory/gpu_table.py``, the same figures the CLI and planner use) covers clusters
without GFD and ``dssup admit`` run offline. A time-sliced GPU (``nvidia.com/gpu.replicas`` > 1)
shares its memory, so the usable share is divided. What a fit is judged against is the memory
CUDA can allocate of it (``dssup.memory.gpus.cuda_memory_of``: the driver total less what the
driver keeps, the one rule the CLI and the planner follow); a configurable reserve, none by
default, is subtracted last.
"""

from __future__ import annotations

from typing import NamedTuple

from dssup.admission.cache import ClusterCache
from dssup.memory.gpus import cuda_memory_of, gpu_for_product, mig_memory_mib

__all__ = ["GpuMemory", "resolve_gpu"]

MiB = 1 << 20


class GpuMemory(NamedTuple):
    """Usable bytes of one GPU after the reserve, and where the figure came from."""

    product: str
    total_bytes: int  # the driver total (label or table) of the whole GPU
    usable_bytes: int  # what a config may use: CUDA's share less the reserve
    source: str  # "node-labels" | "table" | "mig-name"
    shared_by: int = 1
    cuda_bytes: int = 0  # what CUDA can allocate of this job's share
    cuda_note: str = ""  # how the driver's share was found


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
        cuda, note = cuda_memory_of(total, product)
        usable = max(0, cuda // shared - reserve_bytes)
        if best is None or usable < best.usable_bytes:
            best = GpuMemory(product, total, usable, source, shared, cuda // shared, note)
    return best
