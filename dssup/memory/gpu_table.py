"""dssup's one GPU table: every common data-centre GPU, as the driver reports its memory.

Data only (the lookups are in ``gpus.py``). ``memory_mib`` is the driver's total in MiB, read from
public ``nvidia-smi`` / ``rocm-smi`` captures (``memory_source``): what GPU Feature Discovery puts
in ``nvidia.com/gpu.memory`` and what a pod really gets (H100 80GB HBM3 = 81559 MiB, 79.6 GiB, not
80 GiB). The figure depends slightly on the driver (A100 40GB: 40536 MiB under driver 470,
40960 MiB under 580) and on ECC (an L40 with ECC off reports 49140 MiB instead of 46068);
node labels, when present, always win over this table.

``products`` are the GFD ``nvidia.com/gpu.product`` values: the ``nvidia-smi`` name with spaces as
dashes (``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``). AMD nodes advertise the
``amd.com/gpu`` resource and, with the ROCm node labeller (ROCm/k8s-device-plugin,
cmd/k8s-node-labeller/main.go at ed76468), ``amd.com/gpu.product-name`` (the sysfs product name,
spaces as underscores) and ``amd.com/gpu.vram`` in whole GiB, rounded (``192G`` on an MI300X); an
MI250X is two GCDs and Kubernetes counts each as one 64 GiB GPU, so its row is one GCD.

FLOP/s are dense (no 2:4 sparsity). Hardware figures come from datasheet tables (``compute_source``,
``system.source``); a field not checked against such a source is listed in ``unverified``.
"""

from __future__ import annotations

from dssup.memory.gpu_spec import GpuSpec, ReferenceSystem

__all__ = ["GPU_TABLE"]

T = 1e12
G = 1e9
TiB = 1 << 40
PCIE = {3: 32 * G, 4: 64 * G, 5: 128 * G}

# Sources: public pages; "captures" are nvidia-smi / rocm-smi output pasted into issues.
_MODAL = "https://github.com/modal-labs/modal-client/pull/2797 (nvidia-smi totals of 7 GPUs)"
_CAPTURES = "public nvidia-smi captures in repositories (no citable URL found)"
_KUNWAR = "https://www.kunwar.page/chapter/appendix-d-hardware-reference (datasheet table)"
_KLOCK_A100 = "https://glennklockwood.com/garden/processors/A100 (A100 datasheet figures)"
_KLOCK_B200 = "https://glennklockwood.com/garden/processors/B200 (HGX B200 and GB200 figures)"
_KLOCK_PEAK = "https://glennklockwood.com/garden/peak-FLOPS (H100 BF16 989.4 TFLOPS dense)"
_BASEPOD = (
    "https://docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-"
    "enterprise-ai/latest/core-components.html (DGX H100/H200/B200 key specifications)"
)
_DGX_A100 = (
    "https://www.hardwaretimes.com/nvidias-ampere-based-dgx-a100-servers-leverage-amd-epyc-"
    "rome-cpus-instead-of-intel-xeon/ (2x EPYC 7742 = 128 cores, 1 TB) and https://geektopia.es"
    "/es/technology/2020/05/14/noticias/nvidia-anuncia-el-servidor-dgx-a100-ocho-tesla-a100-"
    "desde-200-000-dolares.html (eight 200 Gb/s adapters)"
)
_L40 = "https://www.mullet.se/product.html?product_id=355414 (NVIDIA L40/L40S datasheet table)"
_L4 = "https://grokipedia.com/page/NVIDIA_L4_vs_L40S (L4 datasheet figures, with sparsity)"
_DSV3 = "DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.2 (H800: NVLink, 50 GB/s IB)"
_MI300 = "https://gpu.blog/gpus/instinct-mi300x-mi300x (Infinity Fabric 896 GB/s, PCIe Gen5)"
_NONE = "no public datasheet found"
_RTX_PRO_MEM = (
    "https://github.com/lxc902/realtime-video-demo/blob/b3ca90a502325a77db6825b3e42e888be7512d70"
    "/quantization/README.md ('NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887 MiB'); "
    "public nvidia-smi captures of the Server and Max-Q editions read the same 97887 MiB under "
    "drivers 580 to 596 (no citable URL found)"
)
_RTX_PRO_SHEET = (
    "https://github.com/atineoSE/coding-model-seeks-gpu/blob/ff052946489e8bb55dce164802bdb7c0"
    "1251fde6/pipeline/pipeline/sources/rtxpro6000_specs.md (NVIDIA's RTX PRO 6000 Blackwell "
    "datasheet: 96 GB GDDR7 with ECC, PCIe 5.0 x16, FP32 125 TFLOPS, 4000 FP4 TOPS with "
    "sparsity; no dense BF16/FP8 figure)"
)
_RTX_PRO_GEMM = (
    "https://github.com/zzc0721/torch-performance-test-data/issues/161 (Server Edition, "
    "measured 8192^3 GEMM: BF16 417.34, FP16 406.97 TFLOPS; a floor of the dense peak)"
)


def _system(
    name: str,
    n: int,
    nic: float | None = None,
    host: int | None = None,
    cores: int | None = None,
    source: str = _NONE,
) -> ReferenceSystem:
    return ReferenceSystem(
        name=name,
        gpus_per_node=n,
        nic_gbit_per_gpu=nic,
        host_memory_bytes=host,
        host_cpu_cores=cores,
        source=source,
    )


_DGX_H = _system("DGX H100 / DGX H200", 8, 400, 2 * TiB, 112, _BASEPOD)
_DGX_A = _system("DGX A100", 8, 200, 1 * TiB, 128, _DGX_A100)


def _spec(
    name: str,
    mib: int,
    memory_source: str,
    products: tuple[str, ...],
    aliases: tuple[str, ...],
    *,
    bf16: float | None,
    fp8: float | None,
    fp16: float | None,
    link_bw: float | None,
    link: str,
    system: ReferenceSystem,
    compute_source: str,
    pcie: int | None = 5,
    host_link: str = "",
    host_bw: float = 0.0,
    unverified: tuple[str, ...] = (),
    notes: str = "",
    vendor: str = "nvidia",
) -> GpuSpec:
    """One row; a reference system without a source leaves its GPU count unverified."""
    if system.source == _NONE:
        unverified += ("system.gpus_per_node",)
    return GpuSpec(
        name=name,
        vendor="amd" if vendor == "amd" else "nvidia",
        memory_mib=mib,
        memory_source=memory_source,
        products=products,
        aliases=aliases,
        bf16_flops=bf16,
        fp8_flops=fp8,
        fp16_flops=fp16,
        link_bytes_per_s=link_bw,
        link=link,
        pcie_gen=pcie,
        host_link=host_link or f"PCIe Gen{pcie} x16",
        host_bytes_per_s=host_bw or PCIE[pcie or 5],
        system=system,
        compute_source=compute_source,
        unverified=unverified,
        notes=notes,
    )


_VOLTA = "Volta has no BF16 or FP8 tensor cores (FP16 only). Drivers before R525 report less."


def _v100(form: str, gib: int, mib: int, src: str) -> GpuSpec:
    sxm = form == "SXM2"
    return _spec(
        f"V100-{form}-{gib}GB",
        mib,
        src,
        (f"Tesla-V100-{form.upper()}-{gib}GB",),
        (f"v100-sxm2-{gib}gb", f"v100-{gib}gb") if sxm else (f"v100-pcie-{gib}gb",),
        bf16=None,
        fp8=None,
        fp16=(125 if sxm else 112) * T,
        link_bw=300 * G if sxm else None,
        link="NVLink 2" if sxm else "PCIe",
        system=_system("DGX-1" if sxm else "PCIe server", 8),
        compute_source=_KUNWAR,
        pcie=3,
        unverified=() if sxm else ("fp16_flops",),
        notes=_VOLTA,
    )


def _ampere(
    name: str, mib: int, src: str, products: tuple[str, ...], aliases: tuple[str, ...]
) -> GpuSpec:
    sxm, a800 = "SXM" in name, name.startswith("A800")
    return _spec(
        name,
        mib,
        src,
        products,
        aliases,
        bf16=312 * T,
        fp8=None,
        fp16=312 * T,
        link_bw=(400 * G if a800 else 600 * G) if sxm else None,
        link="NVLink 3" if sxm else "PCIe (optional 2-GPU NVLink bridge)",
        system=_DGX_A if sxm and not a800 else _system("HGX / PCIe server", 8),
        compute_source=_KLOCK_A100,
        pcie=4,
        unverified=("link_bytes_per_s",) if a800 and sxm else (),
        notes="Ampere has no FP8 tensor cores.",
    )


_H_SXM = {"bf16": 989.4 * T, "fp8": 1978.9 * T, "fp16": 989.4 * T}
_H_NVL = {"bf16": 835.5 * T, "fp8": 1670.5 * T, "fp16": 835.5 * T}


def _hopper(
    name: str,
    mib: int,
    src: str,
    products: tuple[str, ...],
    aliases: tuple[str, ...],
    flops: dict[str, float],
    *,
    link_bw: float | None,
    link: str,
    system: ReferenceSystem,
    compute_source: str,
    unverified: tuple[str, ...] = (),
    notes: str = "",
) -> GpuSpec:
    return _spec(
        name,
        mib,
        src,
        products,
        aliases,
        bf16=flops["bf16"],
        fp8=flops["fp8"],
        fp16=flops["fp16"],
        link_bw=link_bw,
        link=link,
        system=system,
        compute_source=compute_source,
        unverified=unverified,
        notes=notes,
    )


def _rtx_pro_6000(
    edition: str, products: tuple[str, ...], aliases: tuple[str, ...], *, measured: bool
) -> GpuSpec:
    """RTX PRO 6000 Blackwell (GB202, 96 GB GDDR7): every edition reports 97887 MiB. NVIDIA
    publishes no dense tensor figure; the Server Edition's are a measured GEMM (a floor)."""
    return _spec(
        f"RTX-PRO-6000-Blackwell-{edition}-96GB",
        97887,
        _RTX_PRO_MEM,
        products,
        aliases,
        bf16=417.34 * T if measured else None,
        fp8=None,
        fp16=406.97 * T if measured else None,
        link_bw=None,
        link="PCIe (no NVLink)",
        system=_system("PCIe server" if measured else "workstation", 8 if measured else 4),
        compute_source=f"{_RTX_PRO_GEMM}; {_RTX_PRO_SHEET}",
        unverified=("bf16_flops", "fp16_flops") if measured else (),
        notes="No published dense BF16/FP8/FP16 figure: "
        + ("BF16/FP16 are measured GEMM throughput, below the peak" if measured else "None")
        + ". MIG up to 4 x 24 GB (a slice: give its size). 'rtx-pro-6000' means the Server "
        "Edition; every edition reports the same memory.",
    )


_FLOPS = ("bf16_flops", "fp8_flops", "fp16_flops")
_SYSTEM = ("system.nic_gbit_per_gpu", "system.host_memory_bytes", "system.host_cpu_cores")

GPU_TABLE: tuple[GpuSpec, ...] = (
    _v100("SXM2", 16, 16384, _CAPTURES + ", driver >= 525"),
    _v100("SXM2", 32, 32768, "https://github.com/Wan-Video/Wan2.1/issues/5 (V100-SXM2 32768MiB)"),
    _v100("PCIe", 16, 16384, _CAPTURES + ", driver >= 525"),
    _v100("PCIe", 32, 32768, _CAPTURES + ", driver >= 525"),
    _ampere(
        "A100-SXM4-40GB",
        40960,
        "https://github.com/bottlerocket-os/bottlerocket-core-kit/pull/834 (driver 580; 40536 "
        "MiB under driver 470: https://github.com/nanopool/phoenix-miner/issues/17)",
        ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("a100-sxm4-40gb", "a100-40gb"),
    ),
    _ampere(
        "A100-SXM4-80GB",
        81920,
        _MODAL,
        ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("a100-sxm4-80gb", "a100-80gb"),
    ),
    _ampere(
        "A100-PCIe-40GB",
        40960,
        _MODAL,
        ("NVIDIA-A100-PCIE-40GB", "A100-PCIE-40GB"),
        ("a100-pcie-40gb",),
    ),
    _ampere("A100-PCIe-80GB", 81920, _MODAL, ("NVIDIA-A100-80GB-PCIe",), ("a100-pcie-80gb",)),
    _ampere(
        "A800-SXM4-80GB",
        81920,
        "https://github.com/dexmal/dexbotic/issues/41 (NVIDIA A800-SXM4-80GB, 81920MiB)",
        ("NVIDIA-A800-SXM4-80GB",),
        ("a800-sxm4-80gb", "a800-80gb", "a800"),
    ),
    _ampere(
        "A800-PCIe-80GB",
        81920,
        "https://github.com/vllm-project/vllm/issues/41519 (NVIDIA A800 80GB PCIe, 81920MiB)",
        ("NVIDIA-A800-80GB-PCIe",),
        ("a800-pcie-80gb",),
    ),
    _hopper(
        "H100-SXM-80GB",
        81559,
        "https://github.com/NVIDIA/nccl/issues/1264 (NVIDIA H100 80GB HBM3, 81559MiB)",
        ("NVIDIA-H100-80GB-HBM3",),
        ("h100-sxm", "h100-sxm5", "h100-80gb", "h100"),
        _H_SXM,
        link_bw=900 * G,
        link="NVLink 4 + NVSwitch",
        system=_DGX_H,
        compute_source=f"{_KLOCK_PEAK}; {_KUNWAR}",
        notes="'h100' means this SXM part; the PCIe card reports the same 81559 MiB.",
    ),
    _hopper(
        "H100-PCIe-80GB",
        81559,
        _CAPTURES + " ('NVIDIA H100 PCIe ... 81559MiB')",
        ("NVIDIA-H100-PCIe",),
        ("h100-pcie",),
        {"bf16": 756 * T, "fp8": 1513 * T, "fp16": 756 * T},
        link_bw=None,
        link="PCIe (optional 2-GPU NVLink bridge)",
        system=_system("PCIe server", 8),
        compute_source=_KUNWAR,
    ),
    _hopper(
        "H100-NVL-94GB",
        95830,
        "https://github.com/NVIDIA/gpu-admin-tools/issues/4 (NVIDIA H100 NVL, 95830MiB)",
        ("NVIDIA-H100-NVL",),
        ("h100-nvl", "h100-94gb"),
        _H_NVL,
        link_bw=600 * G,
        link="NVLink bridge (pairs)",
        system=_system("PCIe server", 8),
        compute_source=_NONE,
        unverified=(*_FLOPS, "link_bytes_per_s"),
    ),
    _hopper(
        "H800-SXM-80GB",
        81559,
        _CAPTURES + " ('NVIDIA H800 ... 81559MiB')",
        ("NVIDIA-H800", "NVIDIA-H800-80GB-HBM3"),
        ("h800-sxm", "h800"),
        _H_SXM,
        link_bw=400 * G,
        link="NVLink 4 (reduced) + NVSwitch",
        system=_system("HGX H800", 8, 400, source=_DSV3),
        compute_source=_DSV3,
        unverified=(*_FLOPS, "link_bytes_per_s"),
        notes="DeepSeek-V3 reports 160 GB/s achievable NVLink and 50 GB/s (400 Gb/s) IB per GPU.",
    ),
    _hopper(
        "H20-96GB",
        97871,
        _CAPTURES + " ('NVIDIA H20 ... 97871MiB')",
        ("NVIDIA-H20",),
        ("h20",),
        {"bf16": 148 * T, "fp8": 296 * T, "fp16": 148 * T},
        link_bw=900 * G,
        link="NVLink 4 + NVSwitch",
        system=_system("HGX H20", 8),
        compute_source="https://github.com/zzc0721/torch-performance-test-data/issues/77 "
        "(measured BF16 GEMM 142 TFLOPS; no public datasheet)",
        unverified=(*_FLOPS, "link_bytes_per_s"),
    ),
    _hopper(
        "H200-SXM-141GB",
        143771,
        _CAPTURES + " ('NVIDIA H200 ... 143771MiB', driver 570)",
        ("NVIDIA-H200",),
        ("h200-sxm", "h200-141gb", "h200"),
        _H_SXM,
        link_bw=900 * G,
        link="NVLink 4 + NVSwitch",
        system=_DGX_H,
        compute_source=_KUNWAR,
        notes="'h200' means this SXM part; the H200 NVL reports the same 143771 MiB.",
    ),
    _hopper(
        "H200-NVL-141GB",
        143771,
        _CAPTURES + " ('NVIDIA H200 NVL ... 143771MiB')",
        ("NVIDIA-H200-NVL",),
        ("h200-nvl",),
        _H_NVL,
        link_bw=900 * G,
        link="NVLink bridge (2 or 4 GPUs)",
        system=_system("PCIe server", 8),
        compute_source=_NONE,
        unverified=(*_FLOPS, "link_bytes_per_s"),
    ),
    _spec(
        "GH200-480GB",
        97871,
        "https://github.com/marin-community/marin/pull/5446 (NVIDIA GH200 480GB, 97871 MiB)",
        ("NVIDIA-GH200-480GB",),
        ("gh200-480gb", "gh200"),
        bf16=_H_SXM["bf16"],
        fp8=_H_SXM["fp8"],
        fp16=_H_SXM["fp16"],
        link_bw=900 * G,
        link="NVLink 4",
        system=_system("one GH200 superchip per node", 1, None, 480 * 10**9, 72),
        compute_source=_NONE,
        pcie=None,
        host_link="NVLink-C2C to Grace",
        host_bw=900 * G,
        unverified=(*_FLOPS, "link_bytes_per_s", "host_bytes_per_s", *_SYSTEM),
        notes="96 GB HBM3; '480GB' is the Grace LPDDR5X. The 144 GB HBM3e GH200 is not in this "
        "table (no verified driver figure): give its size.",
    ),
    _spec(
        "B200-180GB",
        183359,
        "https://github.com/NVIDIA/TensorRT-LLM/issues/10278 (NVIDIA B200, 183359MiB)",
        ("NVIDIA-B200",),
        ("b200",),
        bf16=2250 * T,
        fp8=4500 * T,
        fp16=2250 * T,
        link_bw=1800 * G,
        link="NVLink 5 + NVSwitch",
        system=_system("DGX B200", 8, 400, 2 * TiB, 112, _BASEPOD),
        compute_source=_KLOCK_B200,
        unverified=("host_bytes_per_s", "system.host_memory_bytes", "system.host_cpu_cores"),
        notes="HGX B200 at 1000 W. The GPU is specified for PCIe Gen6; DGX B200's Xeons are Gen5.",
    ),
    _spec(
        "GB200-186GB",
        189471,
        _CAPTURES + " ('NVIDIA GB200 ... 189471MiB')",
        ("NVIDIA-GB200",),
        ("gb200",),
        bf16=2500 * T,
        fp8=5000 * T,
        fp16=2500 * T,
        link_bw=1800 * G,
        link="NVLink 5 (NVL72 rack)",
        system=_system("GB200 NVL72 compute tray", 4, 400, 2 * 480 * 10**9, 144),
        compute_source=_KLOCK_B200,
        pcie=None,
        host_link="NVLink-C2C to Grace (shared by 2 GPUs)",
        host_bw=450 * G,
        unverified=("host_bytes_per_s", "system.gpus_per_node", *_SYSTEM),
        notes="GB200 variant of B200 at 1200 W.",
    ),
    _spec(
        "L4-24GB",
        23034,
        _MODAL,
        ("NVIDIA-L4",),
        ("l4",),
        bf16=121 * T,
        fp8=242.5 * T,
        fp16=121 * T,
        link_bw=None,
        link="PCIe",
        system=_system("PCIe server", 8),
        compute_source=_L4,
        pcie=4,
    ),
    _spec(
        "L40-48GB",
        46068,
        _CAPTURES + " ('NVIDIA L40 ... 46068MiB', ECC on)",
        ("NVIDIA-L40",),
        ("l40",),
        bf16=181.05 * T,
        fp8=362 * T,
        fp16=181.05 * T,
        link_bw=None,
        link="PCIe",
        system=_system("PCIe server", 8),
        compute_source=_L40,
        pcie=4,
        notes="With ECC off the driver reports 49140 MiB.",
    ),
    _spec(
        "L40S-48GB",
        46068,
        "https://github.com/akash-network/provider-configs/pull/99 (NVIDIA L40S, 46068 MiB); "
        + _MODAL,
        ("NVIDIA-L40S",),
        ("l40s",),
        bf16=362.05 * T,
        fp8=733 * T,
        fp16=362.05 * T,
        link_bw=None,
        link="PCIe",
        system=_system("PCIe server", 8),
        compute_source=_L40,
        pcie=4,
    ),
    _rtx_pro_6000(
        "Server",
        ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",),
        ("rtx-pro-6000-server", "rtx-pro-6000"),
        measured=True,
    ),
    _rtx_pro_6000(
        "Workstation",
        (
            "NVIDIA-RTX-PRO-6000-Blackwell-Workstation-Edition",
            "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition",
        ),
        ("rtx-pro-6000-workstation", "rtx-pro-6000-max-q"),
        measured=False,
    ),
    _spec(
        "T4-16GB",
        15360,
        _MODAL,
        ("Tesla-T4",),
        ("t4",),
        bf16=None,
        fp8=None,
        fp16=65 * T,
        link_bw=None,
        link="PCIe",
        system=_system("PCIe server", 8),
        compute_source=_NONE,
        pcie=3,
        unverified=("fp16_flops",),
        notes="Turing has no BF16 tensor cores (FP16 only).",
    ),
    _spec(
        "A10-24GB",
        23028,
        _MODAL,
        ("NVIDIA-A10",),
        ("a10",),
        bf16=125 * T,
        fp8=None,
        fp16=125 * T,
        link_bw=None,
        link="PCIe",
        system=_system("PCIe server", 8),
        compute_source=_NONE,
        pcie=4,
        unverified=("bf16_flops", "fp16_flops"),
    ),
    _spec(
        "A10G-24GB",
        23028,
        "https://github.com/NVIDIA/DCGM/issues/232 (NVIDIA A10G, 23028MiB)",
        ("NVIDIA-A10G",),
        ("a10g",),
        bf16=None,
        fp8=None,
        fp16=None,
        link_bw=None,
        link="PCIe",
        system=_system("AWS g5.48xlarge", 8),
        compute_source="AWS-specific part: no public tensor FLOP/s figure",
        pcie=4,
    ),
    _spec(
        "MI250X-GCD-64GB",
        65520,
        "public rocm-smi captures (VRAM Total Memory (B): 68702699520; no citable URL found)",
        ("AMD_Instinct_MI250X",),
        ("mi250x",),
        bf16=191.5 * T,
        fp8=None,
        fp16=191.5 * T,
        link_bw=None,
        link="Infinity Fabric (figure not verified)",
        system=_system("HPE Cray EX235a (4 MI250X = 8 GCDs)", 8, 100, 512 << 30, 64),
        compute_source="https://themop.ru/fsepy3/mi100-architecture.html (MI200: 383 TFLOPS "
        "peak mixed precision per module, i.e. two GCDs)",
        pcie=4,
        unverified=(*_FLOPS, "products", "system.gpus_per_node", *_SYSTEM),
        vendor="amd",
        notes="One GCD (Kubernetes counts each MI250X as two GPUs); amd.com/gpu.vram=64G.",
    ),
    _spec(
        "MI300X-192GB",
        196592,
        "https://github.com/ROCm/legacy-rocm-build/issues/4750 (rocm-smi VRAM Total Memory "
        "(B): 206141652992)",
        ("AMD_Instinct_MI300X_OAM",),
        ("mi300x",),
        bf16=1307.4 * T,
        fp8=2614.9 * T,
        fp16=1307.4 * T,
        link_bw=896 * G,
        link="Infinity Fabric (xGMI, 8-GPU mesh)",
        system=_system("8x MI300X platform", 8, source=_MI300),
        compute_source=_MI300,
        unverified=_FLOPS,
        vendor="amd",
        notes="amd.com/gpu.vram=192G from the ROCm node labeller.",
    ),
)

# Device memory bandwidth (datasheet, bytes/s), added for the planner's step-time model.
_HPCTECH = "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html (H100 datasheet table)"
_HBM: dict[str, tuple[float, str]] = {
    "V100-SXM2-16GB": (900 * G, _NONE),
    "V100-SXM2-32GB": (900 * G, _NONE),
    "V100-PCIe-16GB": (900 * G, _NONE),
    "V100-PCIe-32GB": (900 * G, _NONE),
    "A100-SXM4-40GB": (1555 * G, _NONE),
    "A100-SXM4-80GB": (2039 * G, _NONE),
    "A100-PCIe-40GB": (1555 * G, _NONE),
    "A100-PCIe-80GB": (1935 * G, _NONE),
    "A800-SXM4-80GB": (2039 * G, _NONE),
    "A800-PCIe-80GB": (1935 * G, _NONE),
    "H100-SXM-80GB": (3350 * G, _HPCTECH),
    "H100-PCIe-80GB": (2000 * G, _HPCTECH),
    "H100-NVL-94GB": (3900 * G, _NONE),
    "H800-SXM-80GB": (3350 * G, _NONE),
    "H20-96GB": (4000 * G, _NONE),
    "H200-SXM-141GB": (4800 * G, _NONE),
    "H200-NVL-141GB": (4800 * G, _NONE),
    "GH200-480GB": (4000 * G, _NONE),
    "B200-180GB": (8000 * G, _NONE),
    "GB200-186GB": (8000 * G, _NONE),
    "L4-24GB": (300 * G, _NONE),
    "L40-48GB": (864 * G, _NONE),
    "L40S-48GB": (864 * G, _NONE),
    "T4-16GB": (320 * G, _NONE),
    "A10-24GB": (600 * G, _NONE),
    "A10G-24GB": (600 * G, _NONE),
    "MI250X-GCD-64GB": (1638 * G, _NONE),
    "MI300X-192GB": (5300 * G, _NONE),
    # RTX PRO 6000 Blackwell, every edition: 1792 GB/s GDDR7 (NVIDIA's product page figure)
    **{
        f"RTX-PRO-6000-Blackwell-{edition}-96GB": (1792 * G, _NONE)
        for edition in ("Server", "Workstation")
    },
}


def _with_hbm(spec: GpuSpec) -> GpuSpec:
    """A row added without a bandwidth keeps none: the planner then asks for ``--hbm-tbs``."""
    if spec.name not in _HBM:
        return spec
    bw, src = _HBM[spec.name]
    unverified = spec.unverified + (("hbm_bytes_per_s",) if src == _NONE else ())
    return spec.model_copy(
        update={"hbm_bytes_per_s": bw, "hbm_source": src, "unverified": unverified}
    )


# What CUDA can allocate (totalGlobalMem): the driver total less what the driver reserves.
_CUDA: dict[str, tuple[int, str]] = {
    "H100-SXM-80GB": (
        85_045_477_376,
        "thamada/nvidia-smi 03fbe6e nvsim/H100SXMx8_deviceQuery.py ('81106 MBytes "
        "(85045477376 bytes)') and nvsim/H100SXMx8_smi.py (nvidia-smi -q, driver 565.57.01: "
        "Total 81559 MiB, Reserved 454 MiB, Free 81106 MiB)",
    ),
    "H800-SXM-80GB": (
        84_943_110_144,
        "deepseek-ai/profile-data 4496024 train.json (deviceProperties totalGlobalMem of "
        "DeepSeek's H800s, the trace of their training step)",
    ),
}


def _with_cuda(spec: GpuSpec) -> GpuSpec:
    if spec.name not in _CUDA:
        return spec
    nbytes, src = _CUDA[spec.name]
    return spec.model_copy(update={"cuda_memory_bytes": nbytes, "cuda_memory_source": src})


GPU_TABLE = tuple(_with_cuda(_with_hbm(spec)) for spec in GPU_TABLE)
