"""The webhook judges fit as ``dssup plan`` does (``dssup.memory.capacity``): against what CUDA can
allocate of a GPU, with no default margin or reserve; a job within the memory model's uncertainty
of the limit is allowed with a warning naming the band and its source, and denied only when it
does not fit."""

import copy

import pytest
from admission_helpers import cluster_cache, load

from dssup.admission import InMemoryCache, Policy, PolicySettings
from dssup.admission.gpus import resolve_gpu
from dssup.memory.capacity import DEFAULT_MARGIN, band
from dssup.memory.gpus import DRIVER_RESERVE, gpu_for_product, usable_memory

MiB = 1 << 20


def test_the_defaults_are_capacity_py_s() -> None:
    s = PolicySettings()
    assert s.plan_margin == DEFAULT_MARGIN == 0.0 and s.reserve_bytes == 0


@pytest.mark.parametrize(
    ("product", "how"),
    [
        ("NVIDIA-H800", "totalGlobalMem"),
        ("NVIDIA-H100-80GB-HBM3", "totalGlobalMem"),
        ("NVIDIA-H200", "estimated"),  # no capture of its own: the largest captured share
    ],
)
def test_a_table_gpu_is_what_the_planner_judges_against(product: str, how: str) -> None:
    spec = gpu_for_product(product)
    assert spec is not None
    mem = resolve_gpu((product,), InMemoryCache(), 0)
    assert mem is not None and mem.source == "table"
    assert mem.usable_bytes == mem.cuda_bytes == usable_memory(spec) < mem.total_bytes
    assert how in mem.cuda_note


def test_node_labels_less_what_the_driver_keeps_then_the_reserve() -> None:
    cache = cluster_cache()  # H800 nodes labelled 81559 MiB, as NVML reports the driver total
    spec = gpu_for_product("NVIDIA-H800")
    assert spec is not None and spec.cuda_memory_bytes is not None
    mem = resolve_gpu(("NVIDIA-H800",), cache, 0)
    assert mem is not None and mem.source == "node-labels"
    assert mem.total_bytes == 81559 * MiB == spec.memory_bytes
    assert mem.usable_bytes == spec.cuda_memory_bytes  # counted once: not less a reserve too
    reserved = resolve_gpu(("NVIDIA-H800",), cache, 1 << 30)
    assert reserved is not None and reserved.usable_bytes == mem.usable_bytes - (1 << 30)
    # a time-sliced GPU (2 replicas) shares what CUDA can allocate; the driver keeps its part once
    shared = resolve_gpu(("NVIDIA-L4-SHARED",), cache, 0)
    assert shared is not None and shared.shared_by == 2
    assert shared.usable_bytes == int(shared.total_bytes * (1 - DRIVER_RESERVE)) // 2


def _on(gpu_mib: int) -> tuple[Policy, dict[str, object]]:
    """The Llama-3-70B JobSet fixture on nodes of an unlisted GPU labelled ``gpu_mib``."""
    cache = cluster_cache()
    labels = {
        "nvidia.com/gpu.product": "TEST-GPU",
        "nvidia.com/gpu.memory": str(gpu_mib),
        "nvidia.com/gpu.count": "8",
    }
    cache.upsert({"kind": "Node", "metadata": {"name": "test-1", "labels": labels}})
    obj = copy.deepcopy(load("jobset-llama70b.yaml"))
    spec = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # type: ignore[index]
    spec["nodeSelector"] = {"nvidia.com/gpu.product": "TEST-GPU"}
    return Policy(cache), obj


def _label_for(peak_bytes: int, usable_share: float) -> int:
    """The label (MiB) whose CUDA-allocatable share puts ``peak_bytes`` at ``usable_share``."""
    return int(peak_bytes / usable_share / (1 - DRIVER_RESERVE) / MiB) + 1


def test_near_the_limit_is_allowed_with_the_band_and_its_source() -> None:
    policy, obj = _on(143771)
    ref = policy.judge(obj, "team-a", "validate")
    assert ref.code == "fits" and not any("near the limit" in w for w in ref.warnings)
    peak = float(ref.audit["estimate-gib"]) * (1 << 30)
    b = band("megatron")
    policy, obj = _on(_label_for(peak, 1 - b.fraction / 2))
    for mode in ("validate", "warn", "mutate"):
        d = policy.judge(obj, "team-a", mode)  # type: ignore[arg-type]
        assert d.allowed and d.code == "fits", (mode, d.message)
        assert "near the limit" in d.message and b.source in d.message
        (near,) = [w for w in d.warnings if "near the limit" in w]
        assert f"{b.fraction:.1%} uncertainty" in near and b.source in near and len(near) <= 256
    policy, obj = _on(_label_for(peak, 1.02))  # over the limit: the only denial
    d = policy.judge(obj, "team-a", "validate")
    assert not d.allowed and d.code in {"predicted-oom", "no-feasible-plan"}
    assert "CUDA can allocate" in d.message and "the driver keeps" in d.message


def test_the_cli_flags_default_to_the_same() -> None:
    from dssup.cli.admit import admit_cmd

    defaults = {p.name: p.default for p in admit_cmd.params}
    assert defaults["plan_margin"] == DEFAULT_MARGIN and defaults["reserve"] == "0"
