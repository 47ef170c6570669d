"""How a model is trained: parallel layout, training knobs, precision, overheads.

These are the inputs the estimator and the planner vary. Each field carries its unit and the
reason it matters; validation against a particular model (TP dividing heads, EP dividing
experts, ...) happens in ``validate.py`` because it needs both objects.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dssup.errors import ConfigError
from dssup.memory.profile import EagerProfile
from dssup.memory.traced import TracedProfile

__all__ = [
    "Convention",
    "GiB",
    "Layout",
    "Overheads",
    "Precision",
    "Recompute",
    "Schedule",
    "Training",
]

GiB = 1 << 30
Convention = Literal["paper", "megatron"]
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved", "dualpipe"]
RECOMPUTE_LEVELS: tuple[Recompute, ...] = ("none", "selective", "full")

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Layout(BaseModel):
    """Parallel layout of one training job. World size = tp * cp * pp * dp."""

    model_config = _FROZEN
    tp: int = Field(1, ge=1, description="tensor-parallel size (GPUs splitting each matrix)")
    sp: bool = Field(True, description="sequence parallelism with TP (splits norms/dropout by tp)")
    pp: int = Field(1, ge=1, description="pipeline-parallel stages")
    vpp: int = Field(1, ge=1, description="virtual pipeline chunks per stage (interleaved 1F1B)")
    ep: int = Field(1, ge=1, description="expert-parallel size (routed experts split over ep)")
    etp: int = Field(
        1, ge=1, description="expert tensor-parallel size (each expert split over etp)"
    )
    dp: int = Field(1, ge=1, description="data-parallel size")
    cp: int = Field(1, ge=1, description="context-parallel size (sequence split over cp)")
    schedule: Schedule = Field("1f1b", description="pipeline schedule")
    layers_per_stage: tuple[int, ...] | None = Field(
        None, description="explicit layer count per pipeline stage; None = even split"
    )

    @model_validator(mode="after")
    def _check(self) -> Layout:
        if self.layers_per_stage is not None:
            if len(self.layers_per_stage) != self.pp:
                raise ConfigError(
                    "layers_per_stage",
                    f"{len(self.layers_per_stage)} entries for pp={self.pp}",
                    "give one layer count per pipeline stage",
                )
            if any(n < 0 for n in self.layers_per_stage):
                raise ConfigError("layers_per_stage", "negative layer count", "use counts >= 0")
        if self.schedule == "interleaved" and self.vpp < 2:
            raise ConfigError("vpp", "interleaved schedule needs vpp >= 2", "set --vpp 2 or more")
        return self

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: the group over which MoE parameters are replicated."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)


class Precision(BaseModel):
    """Bytes per element of each kind of state (BF16 = 2, FP32 = 4)."""

    model_config = _FROZEN
    weights: int = Field(2, ge=1, description="bytes per model weight on the GPU")
    gradients: int = Field(4, ge=1, description="bytes per gradient element (FP32 accumulation)")
    master: int = Field(4, ge=0, description="bytes per FP32 master weight (0 = none)")
    moments: int = Field(4, ge=0, description="bytes per Adam moment (m and v each)")
    activations: int = Field(2, ge=1, description="bytes per stored activation element")

    @property
    def optimizer(self) -> int:
        """Optimizer bytes per parameter: master weight plus the two Adam moments."""
        return self.master + 2 * self.moments

    @classmethod
    def named(cls, name: str) -> Precision:
        """``bf16`` (BF16 weights, FP32 grads/master/moments), ``bf16-lowmom``
        (the DeepSeek paper: BF16 Adam moments), ``fp16`` (same sizes as bf16) or ``fp32``."""
        table = {
            "bf16": cls(),
            "fp16": cls(),
            "bf16-lowmom": cls(moments=2),
            "fp32": cls(weights=4, gradients=4, master=0, moments=4, activations=4),
        }
        if name not in table:
            raise ConfigError(
                "precision", f"unknown precision {name!r}", f"use one of {', '.join(table)}"
            )
        return table[name]


class Training(BaseModel):
    """Per-step training knobs that change memory but not the model."""

    model_config = _FROZEN
    micro_batch: int = Field(
        1, ge=1, description="b, sequences per micro-batch per data-parallel rank"
    )
    seq_len: int = Field(4096, ge=1, description="s, tokens per sequence")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step (m)")
    recompute: Recompute = Field("none", description="activation recomputation level")
    flash_attention: bool | None = Field(
        None, description="fused attention stores no s^2 scores; None = convention default"
    )
    dropout: bool | None = Field(
        None, description="dropout masks stored; None = convention default"
    )
    precision: Precision | None = Field(None, description="None = convention default")
    zero_stage: int = Field(0, ge=0, le=3, description="ZeRO stage 0-3")
    offload_optimizer: bool = Field(
        False, description="optimizer states (and master) in host memory"
    )
    offload_params: bool = Field(False, description="ZeRO-3 parameters in host memory")
    moe_imbalance: float = Field(1.0, ge=1.0, description="max/mean routed tokens per rank")
    implementation: EagerProfile | TracedProfile | None = Field(
        None,
        description="trace-derived profile (dssup calibrate): eager (reference blocks) or "
        "traced (the user's own model code); None = the convention's activation model",
    )

    @model_validator(mode="after")
    def _check(self) -> Training:
        if self.offload_params and self.zero_stage != 3:
            raise ConfigError(
                "offload_params", "parameter offload needs ZeRO stage 3", "set --zero 3"
            )
        return self

    def global_batch(self, dp: int) -> int:
        """Sequences per optimizer step: micro-batch x accumulation x data-parallel size."""
        return self.micro_batch * self.grad_accum * dp


class Overheads(BaseModel):
    """Memory that is not model state or activations. Every piece is a named setting."""

    model_config = _FROZEN
    comm_buffer_bytes: int | None = Field(
        None, ge=0, description="NCCL/DDP bucket buffers per GPU, bytes; None = convention default"
    )
    fragmentation: float | None = Field(
        None, ge=0.0, le=1.0, description="allocator fragmentation as a fraction of allocated bytes"
    )
    cuda_context_bytes: int | None = Field(
        None, ge=0, description="CUDA context and kernels, outside the allocator, bytes"
    )
    zero3_max_live_parameters: int = Field(
        1_000_000_000, ge=0, description="DeepSpeed stage3_max_live_parameters (elements)"
    )
    zero3_prefetch_bucket: int = Field(
        50_000_000, ge=0, description="DeepSpeed stage3_prefetch_bucket_size (elements)"
    )
    calibration_bytes: int = Field(
        0, description="observed minus predicted peak after a real run (shifts every stage)"
    )
