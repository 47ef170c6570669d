"""Find a GPU in the one table by canonical name, node label value or CLI alias; read sizes.

The CLI (``--gpu-memory H100``, ``dssup gpus``), the planner's hardware defaults and the webhook's
fallback when Nodes carry no GPU Feature Discovery labels all read ``GPU_TABLE`` through these
functions, so one GPU has one figure everywhere. A short name whose variants differ in memory
(``a100``: 40 or 80 GB; ``v100``: 16 or 32 GB) is ambiguous and answered with the choices; a short
name whose variants report the same memory means the SXM training part (``h100``, ``h200``).

MIG: GPU Feature Discovery's "single" strategy names a node's product ``<gpu>-MIG-<g>g.<N>gb``
and puts the slice's memory in ``nvidia.com/gpu.memory``, which the webhook reads first. Without
that label only the profile name is known, and its ``N`` GB overstates the slice: ``nvidia-smi
mig -lgip`` lists GB200 1g.24gb at 20.00 GiB (NVIDIA/gpu-operator#1303), H100 NVL 1g.12gb at
10.75 GiB (#900), B200 1g.23gb at 20.50 GiB (#1351). The rule here takes the smallest of those
ratios, ``N`` x 1024 MiB x 0.83, capped at the whole GPU's memory: never above the slice.
"""

from __future__ import annotations

import math
import re

from dssup.errors import ConfigError
from dssup.memory.capacity import (
    cuda_bytes,
    cuda_note,
    driver_reserve_fraction,
    usable_bytes,
    usable_note,
)
from dssup.memory.gpu_spec import GpuSpec, ReferenceSystem
from dssup.memory.gpu_table import GPU_TABLE
from dssup.memory.sizes import SIZE_HINT, UNIT_HINT, parse_bytes, parse_quantity, positive

__all__ = [
    "AMBIGUOUS",
    "DRIVER_RESERVE",
    "GPU_TABLE",
    "MIG_MEMORY_FRACTION",
    "GpuSpec",
    "ReferenceSystem",
    "cuda_memory_of",
    "find_gpu",
    "gpu_for_product",
    "mig_memory_mib",
    "parse_bytes",
    "parse_size",
    "usable_memory",
    "usable_memory_note",
]

MIG_MEMORY_FRACTION = 0.83
#: Share of the driver total kept from CUDA, for GPUs without a totalGlobalMem capture.
DRIVER_RESERVE = driver_reserve_fraction(GPU_TABLE)

# Short names that could mean GPUs of different memory: the user must choose.
AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "a100": ("a100-40gb", "a100-80gb"),
    "a100-sxm4": ("a100-sxm4-40gb", "a100-sxm4-80gb"),
    "a100-pcie": ("a100-pcie-40gb", "a100-pcie-80gb"),
    "v100": ("v100-16gb", "v100-32gb", "v100-pcie-16gb", "v100-pcie-32gb"),
    "v100-sxm2": ("v100-sxm2-16gb", "v100-sxm2-32gb"),
    "v100-pcie": ("v100-pcie-16gb", "v100-pcie-32gb"),
    "nvidia-a100": ("a100-40gb", "a100-80gb"),
}


def _norm(text: str) -> str:
    """``NVIDIA H100 80GB HBM3``, ``NVIDIA-H100-80GB-HBM3``, ``nvidia_h100_80gb_hbm3`` -> one key."""
    return re.sub(r"[\s_]+", "-", text.strip()).lower()


def _index() -> dict[str, GpuSpec]:
    out: dict[str, GpuSpec] = {}
    for spec in GPU_TABLE:
        for key in (spec.name, *spec.products, *spec.aliases):
            k = _norm(key)
            if k in out and out[k] is not spec:
                raise RuntimeError(f"GPU table: {key!r} names {out[k].name} and {spec.name}")
            out[k] = spec
    return out


_BY_KEY = _index()
_PRODUCTS = {_norm(p): s for s in GPU_TABLE for p in s.products}
_MIG = re.compile(r"^(?P<gpu>.+?)-mig-(?P<g>\d+)g\.(?P<gb>\d+)gb(\+me)?$", re.IGNORECASE)


def find_gpu(text: str, field: str = "--gpu-memory") -> GpuSpec | None:
    """The GPU ``text`` names (canonical name, GFD product, nvidia-smi name or alias), None if
    it names none. An ambiguous short name raises ``ConfigError`` listing the choices."""
    key = _norm(text)
    if key in AMBIGUOUS:
        raise ConfigError(
            field,
            f"{text!r} is ambiguous",
            f"say which: {', '.join(AMBIGUOUS[key])} (dssup gpus lists every name)",
        )
    return _BY_KEY.get(key)


def gpu_for_product(product: str) -> GpuSpec | None:
    """The GPU a node label value names (GFD ``nvidia.com/gpu.product`` or the AMD labeller's
    ``amd.com/gpu.product-name``), case-insensitively; None if the table does not know it."""
    return _PRODUCTS.get(_norm(product))


def mig_memory_mib(product: str) -> int | None:
    """A conservative memory of the MIG slice a GFD product name such as
    ``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`` describes (see the module docstring), or None."""
    m = _MIG.match(product.strip())
    if m is None:
        return None
    mib = math.floor(int(m.group("gb")) * 1024 * MIG_MEMORY_FRACTION)
    parent = gpu_for_product(m.group("gpu"))
    return min(mib, parent.memory_mib) if parent is not None else mib


def usable_memory(spec: GpuSpec) -> int:
    """Bytes CUDA can allocate on ``spec`` (``capacity.usable_bytes``): what a fit is judged
    against."""
    return usable_bytes(spec, DRIVER_RESERVE)


def cuda_memory_of(total_bytes: int, product: str) -> tuple[int, str]:
    """Bytes CUDA can allocate of a GPU ``product`` (a node label value) whose driver total is
    ``total_bytes`` (GFD's label, or the table's), and how the driver's share was found: the
    one rule ``usable_memory`` follows (``capacity.cuda_bytes``), for the webhook."""
    spec = gpu_for_product(product)
    return cuda_bytes(total_bytes, spec, DRIVER_RESERVE), cuda_note(spec, DRIVER_RESERVE)


def usable_memory_note(spec: GpuSpec) -> str:
    """Where ``usable_memory`` comes from, for the assumptions."""
    return usable_note(spec, DRIVER_RESERVE)


def parse_size(text: str, field: str = "size", *, gpu: bool = True, zero: bool = False) -> int:
    """Bytes of a memory amount: ``80GiB``, ``80GB``, ``0.75GiB``, ``1024B`` or (``gpu``) a GPU
    name from the one table, read as the memory CUDA can allocate on it (``usable_memory``: the
    driver total less its reservation). A bare number is refused (``sizes.py``)."""
    hint = SIZE_HINT if gpu else UNIT_HINT
    value = parse_quantity(text, field, None, hint)
    if value is None and gpu:
        spec = find_gpu(text, field)
        if spec is not None:
            return usable_memory(spec)
    if value is None:
        raise ConfigError(field, f"cannot read {text!r} as a size", hint)
    return positive(value, text, field, zero)
