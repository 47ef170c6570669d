"""AMD GPU Nodes as the ROCm node labeller labels them (issue 15, item 2: ``amd.com/gpu``).

The Node objects carry the labels ROCm/k8s-device-plugin's cmd/k8s-node-labeller/main.go
(@ ed7646843003, ``createLabels``) writes: on a node whose GPUs are all alike, the value under
``amd.com/gpu.<name>`` and ``beta.amd.com/gpu.<name>`` plus a ``beta.amd.com/gpu.<name>.<value>``
counter; on a node with mixed GPUs only counters. ``vram`` is whole GiB, rounded (``192G``).
"""

import copy

import pytest

from dssup.admission import InMemoryCache, Policy
from dssup.admission.gpus import resolve_gpu
from dssup.admission.nodegpu import amd_vram_mib, node_gpu

MI300X = "AMD_Instinct_MI300X_OAM"  # the sysfs product name, spaces as underscores


def _node(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


def _rocm_labels(product: str, vram: str, gpus: int = 8) -> dict[str, str]:
    """A homogeneous node, labeller run with ``-product-name -vram``."""
    return {
        "amd.com/gpu.product-name": product,
        "amd.com/gpu.vram": vram,
        "beta.amd.com/gpu.product-name": product,
        f"beta.amd.com/gpu.product-name.{product}": str(gpus),
        "beta.amd.com/gpu.vram": vram,
        f"beta.amd.com/gpu.vram.{vram}": str(gpus),
        "kubernetes.io/hostname": "x",
    }


def _amd_job(selector: dict[str, str]) -> dict[str, object]:
    container = {"name": "t", "image": "x", "resources": {"limits": {"amd.com/gpu": "8"}}}
    pod = {"containers": [container], "nodeSelector": selector}
    meta = {"name": "j", "namespace": "team-a", "annotations": {"dssup.io/model": "llama-2-7b"}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": {"spec": pod}}}  # fmt: skip


def test_rocm_labels_name_the_gpu_and_its_memory():
    gpu = node_gpu(_rocm_labels(MI300X, "192G"))
    # 192G says 191.5-192.5 GiB; the table's driver figure (196592 MiB) lies inside: exact
    assert gpu is not None and gpu.product == MI300X and gpu.memory_mib == 196592
    assert gpu.replicas == 1


@pytest.mark.parametrize(
    ("product", "vram", "mib"),
    [
        ("AMD_Instinct_MI325X_OAM", "256G", 256 * 1024 - 512),  # not in the table: lower end
        (MI300X, "24G", 24 * 1024 - 512),  # a partitioned MI300X: the label, not the table
        (MI300X, "lots", 0),  # unreadable: no figure (the table answers for the product)
        (MI300X, "0G", 0),
    ],
)
def test_rounded_gib_is_read_at_its_lower_end(product, vram, mib):
    assert amd_vram_mib(vram, product) == mib


def test_older_labellers_beta_keys_and_mixed_nodes():
    beta_only = {k: v for k, v in _rocm_labels(MI300X, "192G").items() if k.startswith("beta.")}
    assert node_gpu(beta_only) == (MI300X, 196592, 1)
    mixed = {  # two GPU kinds: counters only, no single value
        f"amd.com/gpu.product-name.{MI300X}": "4",
        "amd.com/gpu.product-name.AMD_Instinct_MI210": "4",
        "amd.com/gpu.vram.192G": "4",
        "amd.com/gpu.vram.64G": "4",
        f"beta.amd.com/gpu.product-name.{MI300X}": "4",
        "beta.amd.com/gpu.product-name.AMD_Instinct_MI210": "4",
    }
    assert node_gpu(mixed) is None  # dssup does not pick one of them
    assert node_gpu({"kubernetes.io/hostname": "cpu-1"}) is None


def test_amd_job_on_a_labelled_node_gets_the_labelled_memory():
    cache = InMemoryCache()
    cache.upsert(_node("mi-1", {**_rocm_labels(MI300X, "192G"), "pool": "mi300x"}))
    cache.upsert(_node("mi-2", {**_rocm_labels("AMD_Instinct_MI325X_OAM", "256G"), "pool": "x"}))
    info = cache.gpu_product(MI300X)
    assert info is not None and (info.memory_mib, info.nodes) == (196592, 1)
    # the job selects nodes by a label of its own: resolved through the cached Node
    d = Policy(cache).judge(_amd_job({"pool": "mi300x"}), "team-a", "validate")
    assert d.code in {"fits", "config-incomplete"}, d.message
    assert MI300X in d.message  # without the labelled Node the selector names no GPU
    mem = resolve_gpu((MI300X,), cache, 0)
    assert mem is not None and (mem.source, mem.total_bytes) == ("node-labels", 196592 << 20)
    d = Policy(InMemoryCache()).judge(_amd_job({"pool": "mi300x"}), "team-a", "validate")
    assert d.allowed and MI300X not in d.message
    # a product the table does not know is judged from the label alone (its lower end)
    mem = resolve_gpu(("AMD_Instinct_MI325X_OAM",), cache, 0)
    assert mem is not None and mem.source == "node-labels"
    assert mem.total_bytes == (256 * 1024 - 512) << 20


def test_amd_job_on_a_mixed_node_is_not_guessed():
    cache = InMemoryCache()
    mixed = {
        f"amd.com/gpu.product-name.{MI300X}": "4",
        "amd.com/gpu.product-name.AMD_Instinct_MI210": "4",
        "pool": "mixed",
    }
    cache.upsert(_node("mix-1", mixed))
    d = Policy(cache).judge(_amd_job({"pool": "mixed"}), "team-a", "validate")
    assert d.allowed and d.code in {"unknown-gpu", "config-incomplete"}, d.code
    assert "GPU" in d.warnings[0]


def test_a_label_scoped_relist_replaces_only_its_own_nodes():
    """The webhook watches NVIDIA and AMD Nodes with one label selector each; a relist of one
    must not drop the other's Nodes."""
    cache = InMemoryCache()
    nvidia = _node("h-1", {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771"})  # fmt: skip
    cache.upsert(nvidia)
    cache.upsert(_node("mi-old", _rocm_labels(MI300X, "192G")))
    cache.replace_all("Node", [_node("mi-new", _rocm_labels(MI300X, "192G")), copy.deepcopy(nvidia)],
                      label="amd.com/gpu.product-name")  # fmt: skip
    assert cache.gpu_product("NVIDIA-H200") is not None
    assert cache.gpu_product(MI300X) is not None and cache.gpu_product(MI300X).nodes == 1
    cache.replace_all("Node", [], label="nvidia.com/gpu.product")
    assert cache.gpu_product("NVIDIA-H200") is None and cache.gpu_product(MI300X) is not None
