"""Policy settings of the webhook and of ``dssup admit``: every one with its unit and reason."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.memory.capacity import DEFAULT_MARGIN

__all__ = ["PolicySettings"]


class PolicySettings(BaseModel):
    """How strict the policy is and which changes the mutating webhook may make."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    reserve_bytes: int = Field(
        0,
        ge=0,
        description="bytes kept free on each GPU on top of what the driver keeps (other "
        "tenants, headroom you want); default none: the GPU's memory is what CUDA can allocate "
        "of its driver total (``dssup.memory.capacity``), and the CUDA context and NCCL buffers "
        "are in the prediction; applied to node labels and the table alike",
    )
    plan_margin: float = Field(
        DEFAULT_MARGIN,
        ge=0.0,
        lt=1.0,
        description="fraction of usable memory a resized config must leave free; default "
        "none (``dssup.memory.capacity``: a config near the limit is allowed with a warning "
        "that names the memory model's uncertainty, not excluded)",
    )
    allow_recompute: bool = Field(True, description="the resize may raise activation recompute")
    allow_zero: bool = Field(True, description="the resize may raise the ZeRO stage")
    allow_offload: bool = Field(
        False, description="the resize may offload optimizer states to host memory (slow)"
    )
    default_gpu_product: str | None = Field(
        None, description="GFD product name assumed when a GPU job names no product"
    )
    convention: Literal["megatron", "paper"] = Field(
        "megatron", description="memory-model convention (see docs/memory-model.md)"
    )
    estimate_cache_size: int = Field(
        4096, ge=0, description="estimates kept in memory (identical jobs and re-invocations)"
    )
    judgement_cache_size: int = Field(
        4096,
        ge=0,
        description="decisions kept in memory, keyed by the object's content and the cluster "
        "cache's generation (re-invocations, validate after mutate, controller UPDATEs); 0 = off",
    )
