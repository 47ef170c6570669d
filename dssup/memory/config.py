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
    "RECOMPUTE_MODULES",
    "Attention",
    "Convention",
    "Framework",
    "GiB",
    "Layout",
    "Loss",
    "OptimizerImpl",
    "Overheads",
    "Precision",
    "Recompute",
    "RecomputeMethod",
    "Schedule",
    "Training",
]

GiB = 1 << 30
Convention = Literal["paper", "megatron"]
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved", "dualpipe"]
RECOMPUTE_LEVELS: tuple[Recompute, ...] = ("none", "selective", "full")
Framework = Literal["megatron", "deepseek", "deepspeed", "transformers"]
Loss = Literal["fused", "unfused"]
Attention = Literal["flash", "sdpa", "sdpa-cpu", "eager"]
OptimizerImpl = Literal["fused", "foreach", "forloop"]
RecomputeMethod = Literal["uniform", "block"]
# Megatron-core TransformerConfig.recompute_modules (selective granularity) that dssup models.
RECOMPUTE_MODULES = (
    "core_attn",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "moe_act",
    "shared_experts",
)

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
        None,
        description="explicit layer count per pipeline stage (pp*vpp virtual stages when "
        "interleaved); None = even split",
    )
    vpp_group: int | None = Field(
        None,
        ge=1,
        description="interleaved: micro-batches run per virtual stage at a time (Megatron "
        "--microbatch-group-size-per-virtual-pipeline-stage); None = pp, Megatron's default",
    )

    @model_validator(mode="after")
    def _check(self) -> Layout:
        if self.layers_per_stage is not None:
            if len(self.layers_per_stage) != self.stages:
                raise ConfigError(
                    "layers_per_stage",
                    f"{len(self.layers_per_stage)} entries for {self.stages} pipeline stages",
                    "give one layer count per pipeline stage (pp*vpp with interleaving)",
                )
            if any(n < 0 for n in self.layers_per_stage):
                raise ConfigError("layers_per_stage", "negative layer count", "use counts >= 0")
        check_schedule(self)
        return self

    @property
    def stages(self) -> int:
        """Pipeline stages the layers are split into: pp, or pp*vpp virtual stages."""
        return self.pp * self.vpp

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: the group over which MoE parameters are replicated."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)


def check_schedule(layout: Layout) -> None:
    """The pipeline schedule's own constraints (also run by ``validate``: ``model_copy``
    skips validators)."""
    if layout.schedule == "interleaved" and layout.vpp < 2:
        raise ConfigError("vpp", "interleaved schedule needs vpp >= 2", "set --vpp 2 or more")
    if layout.vpp > 1 and layout.schedule != "interleaved":
        raise ConfigError(
            "vpp",
            f"vpp={layout.vpp} needs the interleaved schedule, not {layout.schedule}",
            "drop --vpp or use --schedule interleaved",
        )
    if layout.pp == 1 and layout.schedule != "1f1b":
        raise ConfigError(
            "vpp" if layout.schedule == "interleaved" else "schedule",
            f"{layout.schedule} needs pipeline parallelism, but pp=1",
            "set --pp 2 or more, or drop --schedule/--vpp",
        )
    if layout.schedule == "dualpipe" and layout.pp % 2:
        raise ConfigError(
            "pp",
            f"DualPipe needs an even number of pipeline ranks, not {layout.pp}",
            "use an even --pp (deepseek-ai/DualPipe asserts num_ranks % 2 == 0)",
        )
    if layout.vpp_group is not None and layout.schedule != "interleaved":
        raise ConfigError(
            "vpp_group", "only the interleaved schedule groups micro-batches", "drop it"
        )


class Precision(BaseModel):
    """Bytes per element of each kind of state (BF16 = 2, FP32 = 4)."""

    model_config = _FROZEN
    weights: int = Field(2, ge=1, description="bytes per model weight on the GPU")
    gradients: int = Field(4, ge=1, description="bytes per gradient element (FP32 accumulation)")
    master: int = Field(4, ge=0, description="bytes per FP32 master weight (0 = none)")
    moments: int = Field(4, ge=0, description="bytes per Adam moment (m and v each)")
    activations: int = Field(
        2, ge=2, le=4, description="bytes per stored activation element of the compute dtype"
    )
    cache_fp8: bool = Field(
        False,
        description="linear-layer inputs (and MoE SwiGLU inputs) cached for backward in FP8 "
        "with one FP32 scale per 1x128 tile (DeepSeek-V3, TransformerEngine FP8)",
    )

    @model_validator(mode="after")
    def _check(self) -> Precision:
        if self.activations not in (2, 4):
            raise ConfigError(
                "activations",
                f"{self.activations} bytes is not a compute dtype",
                "use bf16/fp16 (2) or fp32 (4); FP8 caching is activations=fp8",
            )
        return self

    @property
    def optimizer(self) -> int:
        """Optimizer bytes per parameter: master weight plus the two Adam moments."""
        return self.master + 2 * self.moments

    @classmethod
    def named(cls, name: str) -> Precision:
        """``bf16`` (BF16 weights, FP32 grads/master/moments), ``bf16-lowmom``
        (the DeepSeek paper: BF16 Adam moments), ``fp16`` (same sizes as bf16), ``fp8`` (bf16
        with linear-layer inputs cached in FP8, as TransformerEngine and DeepSeek-V3 do) or
        ``fp32``."""
        table = {
            "bf16": cls(),
            "fp16": cls(),
            "bf16-lowmom": cls(moments=2),
            "fp8": cls(cache_fp8=True),
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
    framework: Framework | None = Field(
        None,
        description="training code whose kernels decide what is stored (loss, norms, SwiGLU, "
        "MTP, optimizer): megatron, deepseek (DeepSeek-V3's own, as its report describes it), "
        "deepspeed, transformers; None = megatron (megatron convention only)",
    )
    loss: Loss | None = Field(
        None,
        description="cross-entropy: fused (vocab-parallel, one FP32 b*s*v tensor) or unfused "
        "(logits, FP32 log-softmax and two FP32 gradients); None = framework default",
    )
    mtp: bool | None = Field(
        None,
        description="build the model's multi-token-prediction modules; None = framework "
        "default (megatron yes, transformers and deepspeed no)",
    )
    attention: Attention | None = Field(
        None,
        description="attention kernel: flash (no s^2 scores), sdpa (PyTorch SDPA as CUDA runs "
        "it: flash when q/k/v head dims agree, else the memory-efficient kernel; neither "
        "stores s^2 scores), sdpa-cpu (PyTorch SDPA as the CPU runs it: the math path, FP32 "
        "probabilities, when q/k and v head dims differ; for CPU measurements) or eager; "
        "None = flash_attention/default",
    )
    optimizer: OptimizerImpl | None = Field(
        None,
        description="Adam implementation: fused (no temporaries), foreach (one moment-sized "
        "temporary per parameter), forloop (per tensor); None = framework default",
    )
    recompute_modules: tuple[str, ...] | None = Field(
        None,
        description="selective recompute: Megatron --recompute-modules; None = framework "
        "default (megatron: core_attn)",
    )
    recompute_method: RecomputeMethod | None = Field(
        None,
        description="full recompute: uniform (every unit of recompute_num_layers layers "
        "checkpointed) or block (the first recompute_num_layers layers of each stage); "
        "None = uniform",
    )
    recompute_num_layers: int | None = Field(
        None, ge=1, description="full recompute: layers per unit (uniform) or per stage (block)"
    )

    @model_validator(mode="after")
    def _check(self) -> Training:
        if self.offload_params and self.zero_stage != 3:
            raise ConfigError(
                "offload_params", "parameter offload needs ZeRO stage 3", "set --zero 3"
            )
        bad = sorted(set(self.recompute_modules or ()) - set(RECOMPUTE_MODULES))
        if bad:
            raise ConfigError(
                "recompute_modules",
                f"unknown module(s) {', '.join(bad)}",
                f"use {', '.join(RECOMPUTE_MODULES)}",
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
    zero3_sub_group: int = Field(
        1_000_000_000,
        ge=1,
        description="DeepSpeed sub_group_size (elements): ZeRO-3 steps the optimizer one "
        "sub-group at a time, so its FP32 gradient copy is at most this many elements",
    )
    host_overhead: float = Field(
        0.5,
        ge=0.0,
        description="host memory over the exact offloaded states, as a fraction (pinned "
        "staging, allocator, the process); 0.5 = DeepSpeed's estimator additional_buffer_factor "
        "1.5",
    )
    host_load_bytes: int = Field(
        0,
        ge=0,
        description="bytes per parameter each process holds on the host while building the "
        "model before partitioning (4 = FP32 as DeepSpeed's estimator assumes, 2 = BF16); "
        "0 = not counted (the model is built on the GPU, e.g. Megatron)",
    )
