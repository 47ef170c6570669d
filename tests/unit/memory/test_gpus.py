"""The one GPU table: names resolve, figures are the driver's, and every part reads the same one.

The MiB figures below are copied from public ``nvidia-smi``/``rocm-smi`` captures (the sources
are in ``dssup/memory/gpu_table.py``), not from the table, so a typo in the table fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dssup.admission import InMemoryCache
from dssup.admission.gpus import resolve_gpu
from dssup.errors import ConfigError
from dssup.memory.gpu_spec import GpuSpec, ReferenceSystem
from dssup.memory.gpus import (
    DRIVER_RESERVE,
    GPU_TABLE,
    find_gpu,
    gpu_for_product,
    mig_memory_mib,
    parse_bytes,
    parse_size,
    usable_memory,
    usable_memory_note,
)

MiB = 1 << 20
DSSUP = [sys.executable, "-m", "dssup"]

# product label (GFD / AMD labeller) -> MiB in a public capture
CAPTURED = {
    "NVIDIA-H100-80GB-HBM3": 81559,  # NVIDIA/nccl#1264
    "NVIDIA-H100-PCIe": 81559,
    "NVIDIA-H100-NVL": 95830,  # NVIDIA/gpu-admin-tools#4
    "NVIDIA-H200": 143771,
    "NVIDIA-H800": 81559,
    "NVIDIA-H20": 97871,
    "NVIDIA-GH200-480GB": 97871,  # marin-community/marin#5446
    "NVIDIA-B200": 183359,  # NVIDIA/TensorRT-LLM#10278
    "NVIDIA-GB200": 189471,
    "NVIDIA-A100-SXM4-80GB": 81920,  # modal-labs/modal-client#2797
    "NVIDIA-A100-SXM4-40GB": 40960,
    "NVIDIA-A800-SXM4-80GB": 81920,  # dexmal/dexbotic#41
    "NVIDIA-L40S": 46068,
    "NVIDIA-L40": 46068,
    "NVIDIA-L4": 23034,
    "NVIDIA-A10": 23028,
    "NVIDIA-A10G": 23028,  # NVIDIA/DCGM#232
    "Tesla-T4": 15360,
    "Tesla-V100-SXM2-16GB": 16384,
    "Tesla-V100-SXM2-32GB": 32768,
    "Tesla-V100-PCIE-16GB": 16384,
    "Tesla-V100-PCIE-32GB": 32768,
    "AMD_Instinct_MI300X_OAM": 206141652992 // MiB,  # ROCm/legacy-rocm-build#4750
    # lxc902/realtime-video-demo quantization/README.md @ b3ca90a ('... Workstation Edition,
    # 97887 MiB'); Server and Max-Q captures read the same
    "NVIDIA-RTX-PRO-6000-Blackwell-Workstation-Edition": 97887,
    "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition": 97887,
    "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition": 97887,
}

# The issue's list of "every common data-centre GPU": each must have a row.
REQUIRED = [
    "v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-16gb", "v100-pcie-32gb", "a100-40gb",
    "a100-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "a800", "h100-pcie", "h100-sxm",
    "h100-nvl", "h800", "h20", "h200", "h200-nvl", "gh200", "b200", "gb200", "l4", "l40",
    "l40s", "t4", "a10", "a10g", "mi250x", "mi300x", "rtx-pro-6000",
]  # fmt: skip


def test_every_product_label_resolves_to_its_row() -> None:
    for spec in GPU_TABLE:
        for product in spec.products:
            assert gpu_for_product(product) is spec, product
            assert find_gpu(product) is spec, product
            assert find_gpu(product.replace("-", " ")) is spec, product  # nvidia-smi spelling
        for alias in spec.aliases:
            assert find_gpu(alias.upper()) is spec, alias


@pytest.mark.parametrize(("product", "mib"), sorted(CAPTURED.items()))
def test_memory_is_the_driver_figure(product: str, mib: int) -> None:
    spec = gpu_for_product(product)
    assert spec is not None and spec.memory_mib == mib
    # a GPU name reads as what CUDA can allocate: the driver total less its reservation
    usable = parse_size(product, "--gpu-memory")
    assert usable == usable_memory(spec) < mib * MiB
    assert usable >= mib * MiB * (1 - DRIVER_RESERVE) - 1


def test_usable_memory_is_totalglobalmem_where_captured() -> None:
    """H100: deviceQuery 85,045,477,376 B = nvidia-smi -q Total 81,559 - Reserved 454 MiB
    (thamada/nvidia-smi 03fbe6e); H800: DeepSeek's trace (deepseek-ai/profile-data)."""
    h100, h800 = find_gpu("h100"), find_gpu("h800")
    assert h100 is not None and h800 is not None
    assert usable_memory(h100) == 85_045_477_376  # deviceQuery: "81106 MBytes (85045477376 bytes)"
    assert round(usable_memory(h100) / MiB) == 81106  # nvidia-smi -q: Free 81106 MiB
    assert usable_memory(h800) == 84_943_110_144
    # the largest share any captured GPU keeps from CUDA is the estimate for the others
    assert max(1 - usable_memory(g) / g.memory_bytes for g in (h100, h800)) == DRIVER_RESERVE
    h200 = find_gpu("h200")
    assert h200 is not None and h200.cuda_memory_bytes is None
    assert "estimated" in usable_memory_note(h200) and "totalGlobalMem" in usable_memory_note(h800)


def test_the_issue_list_is_covered_and_every_row_names_its_sources() -> None:
    for name in REQUIRED:
        assert find_gpu(name) is not None, name
    fields = set(GpuSpec.model_fields) | {f"system.{f}" for f in ReferenceSystem.model_fields}
    for spec in GPU_TABLE:
        assert spec.memory_source and spec.compute_source and spec.system.source
        assert set(spec.unverified) <= fields, spec.name
        assert spec.bf16_flops is None or spec.bf16_flops > 1e12


@pytest.mark.parametrize(
    ("name", "choices"),
    [("a100", "a100-40gb, a100-80gb"), ("V100", "v100-16gb, v100-32gb"), ("a100-pcie", "40gb")],
)
def test_ambiguous_names_are_answered_with_the_choices(name: str, choices: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_size(name, "--gpu-memory")
    assert err.value.field == "--gpu-memory" and "ambiguous" in err.value.problem
    assert choices in err.value.fix


def test_short_names_mean_the_training_part_when_memory_agrees() -> None:
    h100, h200 = find_gpu("h100"), find_gpu("H200")
    assert h100 is not None and h100.name == "H100-SXM-80GB"
    assert h100.memory_mib == gpu_for_product("NVIDIA-H100-PCIe").memory_mib  # type: ignore[union-attr]
    assert h200 is not None and h200.memory_mib == find_gpu("h200-nvl").memory_mib  # type: ignore[union-attr]
    rtx = find_gpu("rtx-pro-6000")
    assert rtx is not None and rtx.name == "RTX-PRO-6000-Blackwell-Server-96GB"
    assert rtx.memory_mib == find_gpu("rtx-pro-6000-max-q").memory_mib  # type: ignore[union-attr]
    assert find_gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition") is rtx  # nvidia-smi name
    assert "bf16_flops" in rtx.unverified and rtx.fp8_flops is None  # measured, not published


def test_sizes_need_a_unit_but_byte_counts_do_not() -> None:
    assert parse_size("80GiB") == 80 << 30
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("0.75GiB") == 3 << 28
    assert parse_size("85899345920B") == 80 << 30
    assert parse_size("0", "--reserve", gpu=False, zero=True) == 0
    with pytest.raises(ConfigError, match="80: did you mean 80GiB"):
        parse_size("80", "--gpu-memory")
    with pytest.raises(ConfigError, match="cannot read 'H100'"):
        parse_size("H100", "--comm-buffer", gpu=False)
    with pytest.raises(ConfigError, match="not positive"):
        parse_size("0GiB", "--gpu-memory")
    assert parse_bytes("1048576") == 1 << 20 and parse_bytes("8MiB") == 8 << 20


def test_mig_rule_never_exceeds_the_slices_nvidia_smi_lists() -> None:
    # nvidia-smi mig -lgip: (product, GiB) from NVIDIA/gpu-operator#1303, #900, #1351
    listed = [
        ("NVIDIA-GB200-MIG-1g.24gb", 20.00),
        ("NVIDIA-H100-NVL-MIG-1g.12gb", 10.75),
        ("NVIDIA-H100-NVL-MIG-1g.24gb", 21.62),
        ("NVIDIA-B200-MIG-1g.23gb", 20.50),
        ("NVIDIA-B200-MIG-1g.45gb", 44.25),
    ]
    for product, gib in listed:
        mib = mig_memory_mib(product)
        assert mib is not None and mib <= gib * 1024, product
        assert mib >= 0.8 * gib * 1024, product  # conservative, not absurd
    assert mig_memory_mib("NVIDIA-L4-MIG-1g.999gb") == 23034  # capped at the whole GPU
    assert mig_memory_mib("NVIDIA-H100-80GB-HBM3") is None


def test_cli_admission_and_planner_read_the_same_figure() -> None:
    """One row, one figure: the webhook reads the driver total (what GFD labels carry) and
    judges, like the CLI and the planner, what CUDA can allocate of it (``usable_memory``)."""
    product = "NVIDIA-H100-80GB-HBM3"
    spec = gpu_for_product(product)
    assert spec is not None
    webhook = resolve_gpu((product,), InMemoryCache(), 0)
    assert webhook is not None and webhook.source == "table"
    assert webhook.total_bytes == spec.memory_mib * MiB
    table = usable_memory(spec)
    assert webhook.usable_bytes == table
    est = subprocess.run(
        [*DSSUP, "estimate", "--model", "llama-3-8b", "--gpu-memory", "h100", "--json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert est.returncode in (0, 1), (
        est.stderr
    )  # 1: does not fit one GPU; the figure is what counts
    assert json.loads(est.stdout)["gpu_memory_bytes"] == table
    plan = subprocess.run(
        [*DSSUP, "plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "64",
         "--gpu-memory", product, "--zero-stages", "1", "--json", "--no-offload"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    top = json.loads(plan.stdout)["candidates"][0]
    assert top["peak_bytes"] + top["headroom_bytes"] == table


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["estimate", "--model", "llama-3-8b", "--gpu-memory", "80"], "--gpu-memory: 80: did you mean 80GiB?"),
        (["estimate", "--model", "llama-3-8b", "--gpu-memory", "a100"], "'a100' is ambiguous; say which: a100-40gb, a100-80gb"),
        (["gpus", "nope"], "NAME: unknown GPU 'nope'"),
    ],
)  # fmt: skip
def test_bad_sizes_are_one_line_exit_2(args: list[str], needle: str) -> None:
    out = subprocess.run([*DSSUP, *args], capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and needle in out.stderr


def test_gpus_command_lists_the_table_and_one_row_as_json() -> None:
    out = subprocess.run([*DSSUP, "gpus", "--json"], capture_output=True, text=True, check=False)
    rows = json.loads(out.stdout)
    assert [r["name"] for r in rows] == [g.name for g in GPU_TABLE]
    one = subprocess.run(
        [*DSSUP, "gpus", "mi300x", "--json"], capture_output=True, text=True, check=False
    )
    doc = json.loads(one.stdout)
    assert doc["memory_mib"] == 196592 and doc["vendor"] == "amd"
    table = subprocess.run([*DSSUP, "gpus"], capture_output=True, text=True, check=False).stdout
    assert "H100-SXM-80GB" in table and "81559" in table and "79.65" in table
