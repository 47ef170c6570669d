"""What each convention assumes when the user does not say.

``paper`` reproduces arXiv 2502.07846: 14 bytes per parameter (BF16 Adam moments), softmax
scores stored (no fused attention), dropout masks, no overheads. ``megatron`` is what a
Megatron-core/DeepSeek training job really holds: FP32 moments, flash attention, no dropout,
and the overheads the paper lists as ranges, at mid-range defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from dssup.memory.config import Convention, GiB, Overheads, Precision, Training

__all__ = ["Resolved", "resolve"]


@dataclass(frozen=True, slots=True)
class Resolved:
    """Training and overhead settings with every ``None`` replaced by the convention's default."""

    precision: Precision
    flash: bool
    dropout: bool
    comm_buffer_bytes: int
    fragmentation: float
    cuda_context_bytes: int
    optimizer_transient_per_param: int


_PAPER = Resolved(Precision(moments=2), False, True, 0, 0.0, 0, 0)
_MEGATRON = Resolved(Precision(), True, False, 1 * GiB, 0.10, 3 * GiB // 4, 4)


def resolve(convention: Convention, training: Training, overheads: Overheads) -> Resolved:
    """Fill the unset knobs of ``training`` and ``overheads`` from ``convention``."""
    base = _PAPER if convention == "paper" else _MEGATRON
    return Resolved(
        precision=training.precision or base.precision,
        flash=base.flash if training.flash_attention is None else training.flash_attention,
        dropout=base.dropout if training.dropout is None else training.dropout,
        comm_buffer_bytes=base.comm_buffer_bytes
        if overheads.comm_buffer_bytes is None
        else overheads.comm_buffer_bytes,
        fragmentation=base.fragmentation
        if overheads.fragmentation is None
        else overheads.fragmentation,
        cuda_context_bytes=base.cuda_context_bytes
        if overheads.cuda_context_bytes is None
        else overheads.cuda_context_bytes,
        optimizer_transient_per_param=base.optimizer_transient_per_param,
    )
