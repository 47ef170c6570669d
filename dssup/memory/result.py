"""The estimator's answer: every stage, every term in bytes, and why.

This is the JSON contract of ``dssup estimate --json`` (documented in docs/estimate-json.md):
other tools read it, so fields are only ever added, never renamed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dssup.memory.config import Convention, Layout

__all__ = ["Estimate", "HeldStage", "Inputs", "ParamCounts", "StageBytes", "StageEstimate"]

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
    activations: int = Field(
        description="sum over the held stages of in-flight micro-batches x that stage's "
        "per-micro-batch activations, at the device's peak"
    )
    activations_per_micro_batch: int = Field(
        description="bytes one micro-batch leaves on this device (all held stages)"
    )
    in_flight_micro_batches: int = Field(
        description="stage micro-batches alive at the peak, summed over the held stages "
        "(1F1B: min(PP - i, m); DualPipe: PP + 1; interleaved: chunk micro-batches)"
    )
    in_flight_factor: float = Field(
        description="multiplier on the in-flight count (1.0: counts are exact per stage)"
    )
    zero3_working_set: int = Field(description="ZeRO-3 gathered parameters alive at once")
    buffers: int = Field(description="communication buffers")
    activation_constant: int = Field(
        0,
        description="saved bytes that do not grow with the micro-batch (autocast's bf16 weight copies)",
    )
    backward_working_set: int = Field(
        0,
        description="once per device: the loss's backward tensors or a recomputed layer "
        "re-forwarded for its backward, whichever is larger",
    )
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


class HeldStage(BaseModel):
    """One pipeline stage a device holds (DualPipe: two; interleaved: vpp virtual stages)."""

    model_config = _FROZEN
    stage: int = Field(description="pipeline stage (virtual stage with interleaving), 0-based")
    layers: list[int] = Field(description="global indices of the layers of this stage")
    params: ParamCounts
    embedding: bool = Field(description="holds the input embedding (first stage)")
    head: bool = Field(description="holds the final norm, head and loss (last stage)")
    activations_per_micro_batch: int = Field(description="bytes per micro-batch of this stage")
    in_flight_micro_batches: int = Field(description="micro-batches alive at the device's peak")


class StageEstimate(BaseModel):
    """One device (pipeline rank); every GPU of the same rank holds the same."""

    model_config = _FROZEN
    stage: int = Field(description="pipeline rank of the device (= its stage under 1F1B)")
    layers: list[int] = Field(description="global indices of every layer this device holds")
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
    host_terms: dict[str, int] = Field(
        default_factory=dict,
        description="host_bytes by term (keys: offload.HOST_TERMS: optimizer_states, "
        "fp32_gradients, gradient_buffer, parameters, optimizer_step, pinned_buffers); they "
        "sum to host_bytes",
    )
    phase: str = Field(description="phase holding this stage's peak")
    activation_terms: dict[str, int] = Field(
        default_factory=dict, description="per-micro-batch activation bytes by tensor family"
    )
    held: list[HeldStage] = Field(
        default_factory=list, description="the stages this device holds, in schedule order"
    )


class Inputs(BaseModel):
    """What was estimated, echoed so a reader of the JSON needs no other record of it."""

    model_config = _FROZEN
    parameters: int = Field(description="parameters of the whole model (embedding and head once)")
    layout: Layout = Field(description="parallel layout, with the layer split used")
    micro_batch: int = Field(description="sequences per micro-batch per data-parallel rank")
    seq_len: int = Field(description="tokens per sequence")
    grad_accum: int = Field(description="micro-batches per optimizer step")
    global_batch: int = Field(description="micro_batch x grad_accum x dp, sequences per step")
    recompute: str = Field(description="activation recomputation: none, selective or full")
    zero_stage: int = Field(description="ZeRO stage")
    offload: str = Field(description="none, optimizer, params or both")
    bytes_per_parameter: dict[str, int] = Field(
        description="weights, gradients, master, moments (each moment), activations: bytes"
    )
    calibrated: bool = Field(description="a calibration profile replaced the formula's activations")


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
    near_limit: bool | None = Field(
        None,
        description="it fits, with a peak within the memory model's uncertainty band of the "
        "GPU (``uncertainty``); None without a GPU to check",
    )
    uncertainty: float | None = Field(
        None, description="the band, a fraction of the GPU (capacity.py, with its source)"
    )
    uncertainty_source: str = Field("", description="where the band comes from")
    assumptions: list[str]
    schedule: str = Field("1f1b", description="pipeline schedule: 1f1b, interleaved or dualpipe")
    framework: str | None = Field(
        None, description="training code the activation terms follow (None: paper convention)"
    )
    gpus_per_node: int | None = Field(None, description="GPUs sharing one host (per node)")
    host_bytes_per_node: int | None = Field(
        None,
        description="gpus_per_node x the largest per-GPU host need (training or model build) "
        "of any stage; None without gpus_per_node",
    )
    host_memory_bytes: int | None = Field(None, description="host memory per node to check")
    host_memory_source: str = Field(
        "", description="where host_memory_bytes came from (a flag, or a reference node: assumed)"
    )
    host_fits: bool | None = Field(None, description="host_bytes_per_node <= host_memory_bytes")
    host_headroom_bytes: int | None = None
    inputs: Inputs | None = Field(None, description="the config estimated (model, layout, batch)")

    @property
    def peak(self) -> StageEstimate:
        return self.stages[self.peak_stage]
