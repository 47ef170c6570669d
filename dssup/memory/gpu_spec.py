"""The record of one GPU model in dssup's one GPU table (``gpu_table.py``).

Why a record with sources: the memory a pod really gets is what the driver reports
(``nvidia-smi`` total, GPU Feature Discovery's ``nvidia.com/gpu.memory`` label), not the marketed
size, and the planner's hardware defaults (FLOP/s, links, the host a GPU shares) decide rankings.
Every figure therefore carries where it was read, and a figure that could not be checked against a
datasheet or a capture is named in ``unverified`` instead of being given false precision.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GpuSpec", "ReferenceSystem"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
MiB = 1 << 20


class ReferenceSystem(BaseModel):
    """The node a GPU usually comes in (DGX/HGX for SXM parts): the planner's defaults."""

    model_config = _FROZEN
    name: str = Field(description="reference system, e.g. 'DGX H100'")
    gpus_per_node: int = Field(ge=1, description="GPUs per node (as Kubernetes counts them)")
    nic_gbit_per_gpu: float | None = Field(
        description="scale-out network per GPU, Gb/s (e.g. 400 for 8x ConnectX-7 on 8 GPUs)"
    )
    host_memory_bytes: int | None = Field(description="host (CPU) memory per node, bytes")
    host_cpu_cores: int | None = Field(description="physical CPU cores per node")
    source: str = Field(description="where the system figures were read (URL or title)")


class GpuSpec(BaseModel):
    """One GPU model: memory as the driver reports it, names, hardware figures, sources."""

    model_config = _FROZEN
    name: str = Field(description="canonical name, e.g. 'H100-SXM-80GB'")
    vendor: Literal["nvidia", "amd"]
    memory_mib: int = Field(
        gt=0,
        description="device memory in MiB as the driver reports it (nvidia-smi total, GFD "
        "nvidia.com/gpu.memory; amd-smi/rocm-smi VRAM total): what a pod really gets",
    )
    memory_source: str = Field(description="public capture of the driver's figure (URL)")
    products: tuple[str, ...] = Field(
        description="node label values naming this GPU: GFD nvidia.com/gpu.product (nvidia-smi "
        "name with spaces as dashes) or the AMD labeller's amd.com/gpu.product-name"
    )
    aliases: tuple[str, ...] = Field(description="short names for the CLI (lower case)")
    bf16_flops: float | None = Field(
        description="dense (no sparsity) BF16 tensor FLOP/s; None: no BF16 or no public figure"
    )
    fp8_flops: float | None = Field(
        description="dense FP8 tensor FLOP/s; None: no FP8 tensor cores or no public figure"
    )
    fp16_flops: float | None = Field(description="dense FP16 tensor FLOP/s")
    link_bytes_per_s: float | None = Field(
        description="GPU-to-GPU link inside a node per GPU, both directions together, bytes/s "
        "as marketed (NVLink 900e9 on H100 SXM: 450e9 each way); None: no such link or no "
        "verified figure (see link)"
    )
    link: str = Field(description="what the intra-node link is (NVLink 4, Infinity Fabric, ...)")
    pcie_gen: int | None = Field(description="PCIe generation; None: the host link is not PCIe")
    host_link: str = Field(description="the GPU's link to host memory (PCIe Gen5 x16, C2C, ...)")
    host_bytes_per_s: float = Field(
        description="GPU <-> host memory, both directions together, bytes/s (PCIe Gen5 x16: "
        "128e9): what offloaded states cross"
    )
    system: ReferenceSystem
    hbm_bytes_per_s: float | None = Field(
        default=None,
        description="device memory bandwidth, bytes/s (datasheet): what "
        "memory-bound kernels and small micro-batches run at (the planner's step-time model)",
    )
    hbm_source: str = Field(default="", description="where the memory bandwidth was read")
    cuda_memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="device memory CUDA can allocate, bytes: cudaGetDeviceProperties "
        "totalGlobalMem (torch total_memory, nvidia-smi -q 'Total' minus 'Reserved'), below the "
        "driver total because the driver reserves part of it; None: no public capture",
    )
    cuda_memory_source: str = Field(default="", description="where totalGlobalMem was read")
    compute_source: str = Field(description="where FLOP/s and link figures were read")
    unverified: tuple[str, ...] = Field(
        default=(),
        description="fields whose figure could not be checked against a datasheet or capture",
    )
    notes: str = Field(default="", description="what a user should know (driver, ECC, MIG)")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB
