"""The estimator's answer: every stage, every term in bytes, and why.

This is the JSON contract of ``dssup estimate --json`` (documented in docs/estimate-json.md):
other tools read it, so fields are only ever added, never renamed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dssup.memory.config import Convention

__all__ = ["Estimate", "ParamCounts", "StageBytes", "StageEstimate"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ParamCounts(BaseModel):
    """Parameters held by one GPU of a stage before ZeRO sharding."""

    model_config = _FROZEN
    total: int = Field(description="all parameters on this GPU (after TP/EP split, before ZeRO)")
    moe: int = Field(description="routed + shared experts and routers (sharded over EDP)")
    non_moe: int = Field(description="everything else (sharded over DP)")


class StageBytes(BaseModel):
    """Device bytes of one GPU of a stage, term by term."""

    model_config = _FROZEN
    weights: int
    gradients: int
    optimizer: int
    activations: int = Field(description="in-flight micro-batches x per-micro-batch activations")
    activations_per_micro_batch: int
    in_flight_micro_batches: int = Field(description="1F1B micro-batches held at the peak")
    in_flight_factor: float = Field(description="multiplier on in-flight count (interleaving)")
    zero3_working_set: int = Field(description="ZeRO-3 gathered parameters alive at once")
    buffers: int = Field(description="communication buffers")
    optimizer_transient: int = Field(description="optimizer-step temporaries (foreach Adam)")
    calibration: int = Field(description="shift learned from an observed run")
    fragmentation: int
    cuda_context: int = Field(description="outside the allocator; counts against the GPU")
    total: int = Field(
        description="max(forward-backward, optimizer-step) allocated bytes, plus fragmentation, "
        "CUDA context and calibration: what must fit in GPU memory"
    )

    @property
    def allocated(self) -> int:
        """The allocator's peak (what torch.cuda.max_memory_allocated would report)."""
        return self.total - self.fragmentation - self.cuda_context - self.calibration


class StageEstimate(BaseModel):
    """One pipeline stage (every GPU of a stage holds the same)."""

    model_config = _FROZEN
    stage: int
    layers: list[int] = Field(description="global indices of the layers on this stage")
    params: ParamCounts
    bytes: StageBytes
    host_bytes: int = Field(
        description="host (CPU) memory per GPU in training: offloaded states (DeepSpeed's "
        "buffers, see offload.py) with the host overhead"
    )
    host_init_bytes: int = Field(
        0,
        description="host memory per GPU while the model is built before partitioning "
        "(Overheads.host_load_bytes; 0 when not counted)",
    )
    phase: str = Field(description="phase holding this stage's peak")
    activation_terms: dict[str, int] = Field(
        default_factory=dict, description="per-micro-batch activation bytes by tensor family"
    )


class Estimate(BaseModel):
    """Per-GPU memory of a training config."""

    model_config = _FROZEN
    convention: Convention
    model: str
    world_size: int
    stages: list[StageEstimate]
    peak_stage: int
    peak_bytes: int
    peak_phase: str = Field(description="forward-backward (activations) or optimizer-step")
    gpu_memory_bytes: int | None = None
    fits: bool | None = Field(
        None, description="the GPU check and, with host_memory_bytes, the host check both pass"
    )
    headroom_bytes: int | None = Field(None, description="GPU memory minus peak_bytes")
    assumptions: list[str]
    gpus_per_node: int | None = Field(None, description="GPUs sharing one host (per node)")
    host_bytes_per_node: int | None = Field(
        None,
        description="gpus_per_node x the largest per-GPU host need (training or model build) "
        "of any stage; None without gpus_per_node",
    )
    host_memory_bytes: int | None = Field(None, description="host memory per node to check")
    host_fits: bool | None = Field(None, description="host_bytes_per_node <= host_memory_bytes")
    host_headroom_bytes: int | None = None

    @property
    def peak(self) -> StageEstimate:
        return self.stages[self.peak_stage]
