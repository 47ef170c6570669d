"""The plan the elastic layer reasons about: batch split plus the memory knobs, per world size.

It mirrors the supervisor's ``TrainingPlan`` field for field (micro-batch, accumulation, global
batch, DP, world size, recompute, ZeRO stage, offload) so the supervisor converts with one
``model_dump``, while ``dssup.elastic`` stays importable without the supervisor (layering: the
supervisor imports elastic, never the reverse).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dssup.errors import ConfigError

__all__ = ["OFFLOADS", "BatchPlan", "Offload", "Recompute"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Recompute = Literal["none", "selective", "full"]
Offload = Literal["none", "optimizer", "optimizer+params"]
OFFLOADS: tuple[Offload, ...] = ("none", "optimizer", "optimizer+params")
RECOMPUTES: tuple[Recompute, ...] = ("none", "selective", "full")


class BatchPlan(BaseModel):
    """One attempt's settings at one world size. ``micro x accum x dp == global`` always."""

    model_config = _FROZEN
    micro_batch: int = Field(ge=1, description="sequences per micro-batch per DP rank")
    grad_accum: int = Field(ge=1, description="micro-batches per optimizer step")
    global_batch: int = Field(ge=1, description="sequences per optimizer step; never changes")
    dp: int = Field(ge=1, description="data-parallel ranks")
    world_size: int = Field(ge=1, description="all ranks: nnodes x nproc-per-node")
    recompute: Recompute = Field("none", description="activation recomputation level")
    zero_stage: int = Field(0, ge=0, le=3, description="ZeRO stage 0-3")
    offload: Offload = Field("none", description="what lives in host memory")

    @model_validator(mode="after")
    def _exact(self) -> BatchPlan:
        if self.micro_batch * self.grad_accum * self.dp != self.global_batch:
            raise ConfigError(
                "global_batch",
                f"micro {self.micro_batch} x accumulation {self.grad_accum} x dp {self.dp} "
                f"!= {self.global_batch}",
                "pick a split whose product is the global batch",
            )
        if self.world_size % self.dp:
            raise ConfigError("dp", f"{self.dp} does not divide world {self.world_size}", "")
        if self.offload == "optimizer+params" and self.zero_stage != 3:
            raise ConfigError("offload", "parameter offload needs ZeRO stage 3", "set ZeRO 3")
        return self

    @property
    def model_parallel(self) -> int:
        return self.world_size // self.dp

    def knobs(self) -> tuple[int, int, str, int, str]:
        """What decides memory at a fixed world size (for 'already failed' checks)."""
        return (self.micro_batch, self.grad_accum, self.recompute, self.zero_stage, self.offload)

    def describe(self) -> str:
        text = f"world {self.world_size} (DP {self.dp}): micro {self.micro_batch} x accum "
        text += f"{self.grad_accum} x DP {self.dp} = {self.global_batch}"
        if self.zero_stage:
            text += f", ZeRO-{self.zero_stage}"
        if self.recompute != "none":
            text += f", recompute {self.recompute}"
        if self.offload != "none":
            text += f", offload {self.offload}"
        return text
