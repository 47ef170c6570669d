"""What one measured run is: a model spec plus the knobs an eager PyTorch step exposes.

The same fields drive the memory model (through ``to_training``) so a prediction and a
measurement always describe the identical configuration.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.memory import Layout, ModelSpec, Precision, Training

__all__ = ["DType", "OptimizerKind", "RunSpec", "precision_of"]

DType = Literal["fp32", "bf16", "amp"]
OptimizerKind = Literal["foreach", "fused", "forloop"]


def precision_of(dtype: DType) -> Precision:
    """Bytes per element of each state for an eager run in ``dtype``.

    fp32: everything 4 bytes. bf16: parameters, gradients and AdamW moments in bf16 (AdamW keeps
    its state in the parameter dtype). amp: fp32 parameters and state, bf16 autocast activations.
    """
    if dtype == "fp32":
        return Precision(weights=4, gradients=4, master=0, moments=4, activations=4)
    if dtype == "bf16":
        return Precision(weights=2, gradients=2, master=0, moments=2, activations=2)
    return Precision(weights=4, gradients=4, master=0, moments=4, activations=2)


class RunSpec(BaseModel):
    """One reference training run: one device, or rank 0 of a ``dp``-rank data-parallel job
    (``dssup.runtime.reference.zero``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: ModelSpec = Field(description="the model, exactly as the memory model sees it")
    micro_batch: int = Field(1, ge=1, description="sequences per step")
    seq_len: int = Field(128, ge=2, description="tokens per sequence")
    recompute: Literal["none", "selective", "full"] = Field("none", description="recompute level")
    dtype: DType = Field("fp32", description="fp32, pure bf16, or fp32 master + bf16 autocast")
    optimizer: OptimizerKind = Field("foreach", description="AdamW implementation")
    moe_routing: Literal["capacity", "dropless"] = Field(
        "capacity", description="capacity-padded static shapes, or dropless (real runs only)"
    )
    capacity_factor: float = Field(1.25, ge=1.0, description="expert capacity / mean load")
    steps: int = Field(2, ge=1, description="optimizer steps measured (peak over all)")
    seed: int = Field(0, description="parameter and data seed")
    dp: int = Field(1, ge=1, description="data-parallel ranks (rank 0 is measured)")
    zero_stage: int = Field(0, ge=0, le=2, description="ZeRO stage 0-2 over the dp ranks")
    offload_optimizer: bool = Field(False, description="optimizer states and master on the host")

    @property
    def distributed(self) -> bool:
        """Whether the run needs the data-parallel harness rather than a plain AdamW."""
        return self.dp > 1 or self.zero_stage > 0 or self.offload_optimizer

    def to_layout(self) -> Layout:
        """The memory model's layout of this run: data parallelism only."""
        return Layout(dp=self.dp)

    def to_training(self) -> Training:
        """The memory model's view of this run (dropless: imbalance 1.0 is exact on one device)."""
        imbalance = self.capacity_factor if self.moe_routing == "capacity" else 1.0
        return Training(
            micro_batch=self.micro_batch,
            seq_len=self.seq_len,
            recompute=self.recompute,
            flash_attention=True,
            dropout=False,
            precision=precision_of(self.dtype),
            moe_imbalance=imbalance if self.model.moe is not None else 1.0,
            zero_stage=self.zero_stage,
            offload_optimizer=self.offload_optimizer,
        )
