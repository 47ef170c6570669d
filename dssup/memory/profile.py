"""The ``eager`` implementation profile: activation and transient bytes learned from traces.

Why it exists: the ``megatron`` convention assumes Megatron kernels (fused norms, fused
cross-entropy, gradients kept in persistent buffers). Eager PyTorch stores other things: RMSNorm
internals in fp32, both SwiGLU branches, the fp32 log-softmax of the loss, autocast's bf16
weight copies; it frees gradients between steps (``zero_grad(set_to_none=True)``) and its
foreach AdamW allocates step temporaries. Rather than guess those constants, ``dssup calibrate``
traces one layer of each kind of the user's model (FakeTensorMode + MemTracker, micro-batch 1
and 2, every recompute level) and fits, per recompute level,

    forward/backward peak - W - O = b * (n_dense * a_dense + n_moe * a_moe + a_stage)
                                  +      n_dense * c_dense + n_moe * c_moe + c_stage
    end-of-backward peak  - W - G - O = b * e_sample + e_constant
    optimizer-step peak   - W - G - O = t_opt * parameters

The end of backward (the first block's and the embedding's backward, every other gradient
already there) matters only when the optimizer is off the device: otherwise the optimizer step
holds the same gradients and more. Its term is the stage's (first layer plus embedding), whatever
the layer count.

The result is this model, stored as JSON; the caller parses it and passes it in
``Training.implementation``. The memory model itself stays pure: no torch, no files.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "EagerProfile",
    "LayerCoefficients",
    "LevelBytes",
    "eager_constant",
    "eager_tail",
    "eager_terms",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Level = Literal["none", "selective", "full"]


class LevelBytes(BaseModel):
    """One figure per recompute level, in bytes."""

    model_config = _FROZEN
    none: int = Field(description="bytes without recomputation")
    selective: int = Field(description="bytes with selective recomputation")
    full: int = Field(description="bytes with full (per-layer) recomputation")

    def at(self, level: str) -> int:
        return int(getattr(self, level))


class LayerCoefficients(BaseModel):
    """What one layer (or the stage's own embedding/head/loss) adds to the fwd/bwd peak."""

    model_config = _FROZEN
    per_sample: LevelBytes = Field(description="bytes per sequence of the micro-batch")
    constant: LevelBytes = Field(
        description="batch-independent bytes (autocast weight copies, RoPE casts, head gradient)"
    )


class EagerProfile(BaseModel):
    """Trace-derived coefficients of one eager implementation (one dtype, one optimizer)."""

    model_config = _FROZEN
    kind: Literal["eager"] = Field("eager", description="profile family")
    source: str = Field(description="what was traced (model, dtype, optimizer, torch version)")
    seq_len: int = Field(gt=0, description="sequence length of the traces; per-sample bytes scale")
    dtype: str = Field(description="fp32, bf16 or amp")
    optimizer: str = Field(description="AdamW implementation: foreach, fused or forloop")
    dense: LayerCoefficients | None = Field(None, description="one dense-FFN layer")
    moe: LayerCoefficients | None = Field(None, description="one MoE layer")
    stage: LayerCoefficients = Field(
        description="embedding, final norm, head, loss, MTP and the backward-start transients"
    )
    end_of_backward: LayerCoefficients | None = Field(
        None,
        description="the end-of-backward peak over W + G + O (first block and embedding "
        "backward); None in profiles calibrated before it was traced",
    )
    optimizer_transient_per_param: float = Field(
        ge=0.0, description="optimizer-step temporaries, bytes per optimizer-shard parameter"
    )
    grads_freed_between_steps: bool = Field(
        True, description="zero_grad(set_to_none=True): gradients absent in forward"
    )


def _scaled(value: int, scale: float) -> int:
    return math.ceil(value * scale)


def eager_terms(
    p: EagerProfile,
    dense_layers: int,
    moe_layers: int,
    edge: bool,
    seq_len: int,
    divisor: int,
) -> list[tuple[str, str, int]]:
    """Per-sample activation terms of a stage as (name, group, bytes); the group
    ``eager:<level>`` says which recompute level the term belongs to. Per-sample bytes scale
    linearly with ``seq_len / p.seq_len`` and divide by ``divisor`` (tp * cp; unvalidated)."""
    scale = seq_len / p.seq_len / divisor
    out = []
    for level in ("none", "selective", "full"):
        group = f"eager:{level}"
        for name, coef, count in (
            ("eager.dense_layers", p.dense, dense_layers),
            ("eager.moe_layers", p.moe, moe_layers),
            ("eager.stage", p.stage, 1 if edge else 0),
        ):
            if coef is not None and count:
                out.append((name, group, _scaled(coef.per_sample.at(level) * count, scale)))
    return out


def eager_constant(
    p: EagerProfile, dense_layers: int, moe_layers: int, edge: bool, level: str
) -> int:
    """Batch-independent bytes of a stage during forward/backward at recompute ``level``."""
    total = 0
    for coef, count in ((p.dense, dense_layers), (p.moe, moe_layers), (p.stage, int(edge))):
        if coef is not None:
            total += coef.constant.at(level) * count
    return total


def eager_tail(p: EagerProfile, level: str, seq_len: int, divisor: int) -> tuple[int, int] | None:
    """(per-sample, batch-independent) bytes over W + G + O at the end of backward at recompute
    ``level``, or None when the profile has no such term. Per-sample bytes scale as in
    ``eager_terms``."""
    if p.end_of_backward is None:
        return None
    coef = p.end_of_backward
    return _scaled(coef.per_sample.at(level), seq_len / p.seq_len / divisor), coef.constant.at(
        level
    )
