"""Memory helpers of the example DeepSpeed job: when to cap the address space, and a digest of
the optimizer state that proves a resume kept it.

Why the cap can start late (``--mem-cap-from-step``): on a GPU the Adam moments are allocated by
the first optimizer step, so a job that fits the device has them resident from then on, and
what decides whether a step fits is the *working* memory on top of that resident state. The
working memory is where ZeRO stages differ at the optimizer step (measured on CPU with 2 ranks,
bf16, fused AdamW: ZeRO-1/2 flatten the averaged gradient partition and cast it to fp32 inside
``engine.step``, 2 bytes per parameter above the resident state; ZeRO-3 keeps its gradient
partition resident and needs 1.5), while the resident sizes themselves are equal at 2 ranks
(ZeRO-3's persistent gradient partition is exactly as large as the parameter half it saves).
So the cap is set to the resident size plus a budget once the state is complete: after step
``N`` of a fresh run, or right after a resume (see docs/deepspeed.md).

``state_digest`` sums every parameter's fp32 master weight and Adam moments (float64), whatever
the ZeRO stage, without holding more than one parameter's full tensors at a time: equal digests
before a save and after a (converted) load mean the optimizer state came through intact.
"""

from __future__ import annotations

from typing import Any

import torch
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

from dssup.runtime import memory_cap
from dssup.runtime.process import status_bytes as vm_bytes  # a /proc/self/status figure in bytes

__all__ = ["MemoryCapAt", "state_digest", "vm_bytes"]


class MemoryCapAt:
    """Cap the address space at ``budget_mb`` above the current size, before 0-based optimizer
    step ``from_step`` (a resumed run past it is capped before its first step)."""

    def __init__(self, budget_mb: int, from_step: int) -> None:
        self.budget_mb, self.from_step = budget_mb, from_step
        self.base = self.limit = 0

    @property
    def active(self) -> bool:
        return self.limit > 0

    def before_step(self, step: int) -> bool:
        """Apply the cap if it is due; True when it was applied now."""
        if self.active or not self.budget_mb or step < self.from_step:
            return False
        self.limit = memory_cap(self.budget_mb << 20)
        # read after: memory_cap trims the heap before it measures, so the size before differs
        self.base = vm_bytes("VmSize")
        return True


def _digest(t: torch.Tensor | None) -> list[float] | None:
    if t is None:
        return None
    d = t.detach().double()
    return [float(d.sum()), float(d.square().sum())]


def state_digest(engine: Any) -> dict[str, dict[str, list[float] | None]]:
    """Per parameter: (sum, sum of squares) of fp32 weight, exp_avg and exp_avg_sq.

    Collective under ZeRO-3 (every rank must call it); ZeRO-1/2/3 only.
    """
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:  # ZeRO-1/2 map moments to parameters lazily
        link()
    out: dict[str, dict[str, list[float] | None]] = {}
    for name, p in engine.module.named_parameters():
        out[name] = {
            "fp32": _digest(safe_get_full_fp32_param(p)),
            "exp_avg": _digest(safe_get_full_optimizer_state(p, "exp_avg")),
            "exp_avg_sq": _digest(safe_get_full_optimizer_state(p, "exp_avg_sq")),
        }
    return out
