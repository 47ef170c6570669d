"""The machine a plan is for: per-GPU compute and links, per-node host, and where each
parallel group lands on it.

Why it is an input of the planner: the same layout is fast on one machine and slow on another.
Tensor-parallel collectives that stay on NVLink cost a few percent; the same group across nodes
costs as much as the compute. An expert-parallel all-to-all inside a node rides NVLink; spanning
32 nodes it rides the NICs. A CPU optimizer is as fast as the host cores each GPU gets.

Defaults come from dssup's one GPU table (``gpu_table.py``: the GPU's datasheet figures and its
reference system); every figure says where it came from (``sources``) and each can be
overridden. Group placement follows Megatron-Core's rank order ``tp-cp-ep-dp-pp``
(``megatron/core/parallel_state.py``, RankGenerator): TP innermost, so TP (and EP x ETP, for
experts) occupy consecutive GPUs and stay inside a node whenever they fit in one.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dssup.errors import ConfigError
from dssup.memory.gpu_spec import GpuSpec
from dssup.memory.gpus import find_gpu, gpu_for_product

__all__ = [
    "Link",
    "Topology",
    "default_topology",
    "group_link",
    "topology_for",
    "topology_of",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Topology(BaseModel):
    """Hardware figures the step-time model reads. Bandwidths are per GPU and per direction."""

    model_config = _FROZEN
    gpu: str = Field(description="GPU name the defaults were read for (GPU table key)")
    gpus_per_node: int = Field(ge=1, description="GPUs per node (one NVLink domain)")
    bf16_flops: float = Field(gt=0, description="dense BF16 tensor FLOP/s per GPU")
    fp8_flops: float | None = Field(
        gt=0, description="dense FP8 tensor FLOP/s per GPU; None: no FP8 tensor cores"
    )
    hbm_bytes_per_s: float = Field(gt=0, description="device memory bandwidth per GPU, bytes/s")
    intra_node_bytes_per_s: float = Field(
        gt=0, description="GPU-to-GPU link inside a node, per GPU and direction, bytes/s"
    )
    inter_node_bytes_per_s: float = Field(
        gt=0, description="scale-out network (NIC) per GPU and direction, bytes/s"
    )
    host_bytes_per_s: float = Field(
        gt=0, description="GPU <-> host memory (PCIe or C2C), per GPU and direction, bytes/s"
    )
    host_memory_bytes: int | None = Field(
        None, ge=0, description="host memory per node, bytes; None: unknown"
    )
    host_cpu_cores: int | None = Field(
        None, ge=1, description="physical CPU cores per node; None: unknown (offload not ranked)"
    )
    sources: dict[str, str] = Field(
        default_factory=dict, description="field -> where its value came from"
    )

    @property
    def cores_per_gpu(self) -> float | None:
        """Host cores each GPU's optimizer process gets when every GPU of the node offloads."""
        if self.host_cpu_cores is None:
            return None
        return self.host_cpu_cores / self.gpus_per_node

    def describe(self) -> list[str]:
        """One line per figure with its source, for the plan's assumptions."""
        out = []
        for name in type(self).model_fields:
            if name in ("sources", "gpu"):
                continue
            value = getattr(self, name)
            shown = "unknown" if value is None else _fmt(name, value)
            out.append(f"{name} = {shown} ({self.sources.get(name, 'set by the caller')})")
        return out


def _fmt(name: str, value: float | int) -> str:
    if name.endswith("flops"):
        return f"{value / 1e12:g} TFLOP/s"
    if name.endswith("bytes_per_s"):
        return f"{value / 1e9:g} GB/s"
    if name == "host_memory_bytes":
        return f"{value / (1 << 30):g} GiB"
    return f"{value:g}"


class Link(NamedTuple):
    """Where one collective group runs: its bandwidth per GPU and how much stays in a node
    (internal: built for every layout the planner folds, so a tuple: cheap to create)."""

    size: int  # ranks in the group
    nodes: int  # nodes the group spans
    per_node: int  # group members inside one node
    bytes_per_s: float  # ring/collective bandwidth per GPU, bytes/s
    intra: bool  # the whole group is inside one node


def group_link(topo: Topology, size: int, stride: int, nic: float, nvlink: float) -> Link:
    """The link a group of ``size`` ranks spaced ``stride`` GPUs apart runs on.

    ``nic`` and ``nvlink`` are the achieved bandwidths (the datasheet figure times the
    collective efficiency). Inside a node: NVLink. Across nodes with ``k`` members per node, a
    hierarchical collective (NCCL's ring/tree over NVLink first) sends ``1/k`` of the data
    through each member's NIC, so the group sees ``min(NVLink, k x NIC)`` per GPU.
    """
    return _group_link(topo.gpus_per_node, size, stride, nic, nvlink)


@lru_cache(maxsize=1024)
def _group_link(g: int, size: int, stride: int, nic: float, nvlink: float) -> Link:
    span = size * stride
    if size == 1:
        return Link(1, 1, 1, nvlink, True)
    if span <= g:
        return Link(size, 1, size, nvlink, True)
    per_node = max(1, g // stride) if stride < g else 1
    return Link(size, -(-size // per_node), per_node, min(nvlink, per_node * nic), False)


_NIC_ASSUMED = 100e9 / 8  # bytes/s: a conservative 100 Gb/s NIC per GPU when the table has none


def topology_for(spec: GpuSpec, **overrides: float | int | None) -> tuple[Topology, list[str]]:
    """The topology of ``spec``'s reference system, with ``overrides`` (field -> value) applied;
    and a warning for each figure the table does not have and no override gave."""
    sys, src = spec.system, f"GPU table {spec.name}"
    warnings: list[str] = []
    values: dict[str, float | int | None] = {}
    sources: dict[str, str] = {}

    def put(field: str, value: float | int | None, where: str) -> None:
        if overrides.get(field) is not None:
            values[field], sources[field] = overrides[field], "set on the command line"
        else:
            values[field], sources[field] = value, where

    node = f"{src}, reference node {sys.name}"
    put("gpus_per_node", sys.gpus_per_node, node)
    bf16 = spec.bf16_flops or spec.fp16_flops
    put("bf16_flops", bf16, src if spec.bf16_flops else f"{src} (FP16: no BF16 figure)")
    put("fp8_flops", spec.fp8_flops, src)
    put("hbm_bytes_per_s", spec.hbm_bytes_per_s, src)
    if spec.link_bytes_per_s is not None:
        put(
            "intra_node_bytes_per_s",
            spec.link_bytes_per_s / 2,
            f"{src}: {spec.link}, half of the both-directions figure",
        )
    else:
        put(
            "intra_node_bytes_per_s",
            spec.host_bytes_per_s / 2,
            f"{src} (no GPU link: peers talk over {spec.host_link})",
        )
    nic = None if sys.nic_gbit_per_gpu is None else sys.nic_gbit_per_gpu * 1e9 / 8
    put(
        "inter_node_bytes_per_s",
        nic,
        f"{node}: {sys.nic_gbit_per_gpu:g} Gb/s NIC per GPU" if nic else node,
    )
    put("host_bytes_per_s", spec.host_bytes_per_s / 2, f"{src}: {spec.host_link}, per direction")
    put("host_memory_bytes", sys.host_memory_bytes, node)
    put("host_cpu_cores", sys.host_cpu_cores, node)
    if values["bf16_flops"] is None:
        raise ConfigError(
            "--bf16-tflops",
            f"the GPU table has no dense BF16/FP16 FLOP/s for {spec.name}",
            "pass --bf16-tflops N (the GPU's dense tensor TFLOP/s)",
        )
    if values["hbm_bytes_per_s"] is None:
        raise ConfigError(
            "--hbm-tbs",
            f"the GPU table has no memory bandwidth for {spec.name}",
            "pass --hbm-tbs N (device memory bandwidth, TB/s)",
        )
    if values["inter_node_bytes_per_s"] is None:
        values["inter_node_bytes_per_s"] = _NIC_ASSUMED
        sources["inter_node_bytes_per_s"] = "assumed (unknown): 100 Gb/s per GPU"
        warnings.append(
            f"inter-node bandwidth unknown for {spec.name}: assumed 100 Gb/s per GPU "
            "(pass --nic-gbit N)"
        )
    topo = Topology(gpu=spec.name, sources=sources, **values)
    return topo, warnings


def default_topology() -> Topology:
    """An H100 DGX node: what the planner ranks for when no GPU is named (with a warning)."""
    spec = find_gpu("h100")
    assert spec is not None  # the shipped table has it; a test locks this
    return topology_for(spec)[0]


def topology_of(name: str | None) -> Topology | None:
    """The reference-node topology of a GPU named by a node label (GFD product), a canonical
    name or an alias; None when the table does not know it or lacks its compute figures (an
    A10G has no public tensor FLOP/s): the planner then ranks for its default node and warns.
    Callers are the webhook and the supervisor, which must not fail on a node's GPU."""
    if not name:
        return None
    spec = gpu_for_product(name)
    if spec is None:
        try:
            spec = find_gpu(name)
        except ConfigError:  # an ambiguous short name: no topology rather than a guess
            return None
    if spec is None:
        return None
    try:
        return topology_for(spec)[0]
    except ConfigError:  # a figure the table does not have and no flag can give here
        return None
