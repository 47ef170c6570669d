"""What one traced or measured training step of the user's model is: its source and its knobs.

The same objects travel as JSON from the CLI to the child process and into the accuracy
dataset, so a measurement, a trace and a prediction always describe the identical step:

    optimizer.zero_grad(set_to_none=True)
    with autocast(bf16) if dtype == "amp":
        loss = model(**batch(micro_batch, seq_len))          # transformers: labels = input_ids
    loss.backward(); optimizer.step()                          # AdamW (foreach, fused, for-loop)

repeated ``steps`` times (AdamW creates its state in the first step; the second is the steady
state). A transformers model runs with ``use_cache=False``, no attention mask (every token valid,
one sequence per row) and gradient checkpointing through its own ``activation_checkpointing_enable``
(``use_reentrant=False``, every decoder layer); a ``--module`` model gets
``torch.utils.checkpoint`` around each of its repeated blocks.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Attention",
    "DType",
    "HFSource",
    "Kernels",
    "Knobs",
    "ModuleSource",
    "OptimizerKind",
    "TracedRun",
]

DType = Literal["fp32", "bf16", "amp"]
Attention = Literal["sdpa", "eager"]
OptimizerKind = Literal["foreach", "fused", "forloop"]
Kernels = Literal["cpu", "cuda"]
_FROZEN = ConfigDict(frozen=True, extra="forbid")


class HFSource(BaseModel):
    """A transformers model built from its config with random init (no Hub access)."""

    model_config = _FROZEN
    kind: Literal["hf"] = Field("hf", description="source family")
    config: dict[str, Any] = Field(description="the config.json contents")
    path: str = Field(description="where the config was read (provenance only)")


class ModuleSource(BaseModel):
    """A user factory ``pkg.mod:factory`` returning ``(model, make_batch)``."""

    model_config = _FROZEN
    kind: Literal["module"] = Field("module", description="source family")
    target: str = Field(description="import path of the factory, 'package.module:function'")
    sys_path: list[str] = Field(
        default_factory=list, description="folders put in front of sys.path before importing"
    )


class Knobs(BaseModel):
    """The settings of a training step that change its memory."""

    model_config = _FROZEN
    micro_batch: int = Field(1, ge=1, description="sequences per step")
    seq_len: int = Field(128, ge=2, description="tokens per sequence")
    dtype: DType = Field(
        "fp32",
        description="fp32; bf16 (parameters, gradients, AdamW state); amp (fp32 + bf16 autocast)",
    )
    attention: Attention = Field(
        "sdpa", description="transformers attn_implementation (sdpa or eager); --module: ignored"
    )
    checkpointing: bool = Field(
        False, description="activation (gradient) checkpointing of every repeated block"
    )
    optimizer: OptimizerKind = Field("foreach", description="AdamW implementation")
    kernels: Kernels = Field(
        "cpu",
        description="whose attention kernels a fake trace runs: cpu (what this CPU runs, to "
        "compare with a CPU measurement) or cuda (what CUDA's SDPA dispatch picks: what a GPU "
        "holds; calibration's default, ``cudasdpa.py``)",
    )
    steps: int = Field(2, ge=1, description="optimizer steps measured (peak over all)")
    seed: int = Field(0, description="parameter and data seed of real runs")


class TracedRun(BaseModel):
    """One step configuration of one model: source, knobs, and which blocks are kept."""

    model_config = _FROZEN
    source: HFSource | ModuleSource = Field(discriminator="kind", description="the model code")
    knobs: Knobs = Field(default_factory=Knobs, description="step settings")
    keep_blocks: tuple[int, ...] | None = Field(
        None,
        description="indices of the repeated blocks kept (a reduced model for calibration); "
        "None keeps all",
    )
