"""Trace attention as CUDA would run it, so a CPU trace does not report CPU-only tensors.

``torch.nn.functional.scaled_dot_product_attention`` picks a kernel by device. On the CPU, a
call whose q/k and v head dims differ (MLA: 192 and 128) takes the math path, which keeps the
s x s probabilities in FP32 for the backward (32 GiB per DeepSeek-V3 layer at 4096 tokens).
On CUDA the same call takes the memory-efficient kernel, which keeps only q, k, v, the output
and an FP32 log-sum-exp per query and head. A calibration traced on the CPU would report the
first as GPU memory. So calibration traces (``Knobs.kernels == "cuda"``) send every SDPA call to
the aten operator CUDA's dispatch would pick; FakeTensorMode runs that operator's meta rule,
and autograd saves for its backward exactly what the CUDA operator saves (its derivative
formula is the same on every device).

The choice follows the order and checks of CUDA's dispatcher (PyTorch's
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, torch 2.13), for the conditions a
training step meets: flash when the inputs are 16-bit, q, k and v have one head dim (at most
256, a multiple of 8) and no mask is given (GQA included); else the memory-efficient kernel when
q and k share a head dim and the head dims are aligned (8 elements for 16-bit, 4 for FP32) and
key/value heads equal the query heads; else the math path. These rules were read, not run on a
GPU here; ``gpu/sdpa_kernels.py`` checks them against torch's own ``can_use_*`` on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["CudaSdpa", "choose", "cuda_sdpa"]

_aten = torch.ops.aten
_LOW = (torch.float16, torch.bfloat16)


def choose(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[str, str]:
    """(kernel, why) as CUDA's dispatcher would pick for a training call."""
    dq, dk, dv = q.size(-1), k.size(-1), v.size(-1)
    low = q.dtype in _LOW
    if mask is None and low and dq == dk == dv and dq <= 256 and dq % 8 == 0:
        return "flash", f"16-bit, head dim {dq}, no mask"
    why_not = (
        "a mask" if mask is not None
        else f"{q.dtype}" if not low
        else f"head dims q/k/v {dq}/{dk}/{dv}"
    )  # fmt: skip
    align = 8 if low else 4
    same_heads = q.size(-3) == k.size(-3) == v.size(-3)
    if dq == dk and dq % align == 0 and dv % align == 0 and same_heads:
        return "efficient", f"memory-efficient kernel (not flash: {why_not})"
    return "math", f"math path (neither flash nor memory-efficient: {why_not})"


def _bias(mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """A boolean mask as the additive bias CUDA converts it to (``convert_boolean_attn_mask``)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    return torch.where(mask, zero, torch.full((), float("-inf"), dtype=q.dtype, device=q.device))


class CudaSdpa:
    """Stands in for ``F.scaled_dot_product_attention`` with CUDA's kernel; ``used`` counts the
    kernels taken, with why. A replaced function, not a TorchFunctionMode: the recomputation of
    a checkpointed block in backward must take the same kernel as its forward, and modes are
    not active there."""

    def __init__(self) -> None:
        self.used: dict[str, int] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._sdpa(*args, **kwargs)

    def _sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        kernel, why = choose(q, k, v, attn_mask)
        self.used[why] = self.used.get(why, 0) + 1
        if kernel == "flash":
            out = _aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale
            )
            return out[0]  # type: ignore[no-any-return]
        if kernel == "efficient":
            grad = q.requires_grad or k.requires_grad or v.requires_grad
            out = _aten._scaled_dot_product_efficient_attention(
                q, k, v, _bias(attn_mask, q), grad, dropout_p, is_causal, scale=scale
            )
            return out[0]  # type: ignore[no-any-return]
        if enable_gqa and q.size(-3) != k.size(-3):  # the math path repeats k and v
            rep = q.size(-3) // k.size(-3)
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
        out = _aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale
        )
        return out[0]  # type: ignore[no-any-return]


@contextmanager
def cuda_sdpa() -> Iterator[CudaSdpa]:
    """While it lasts, ``torch.nn.functional.scaled_dot_product_attention`` runs CUDA's kernel
    (in a FakeTensorMode trace). Code that bound the function to another name before (``from
    torch.nn.functional import scaled_dot_product_attention`` at import) keeps the CPU's; the
    profile's report lists the kernels taken, so a model whose attention never came here
    shows none."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    stand_in = CudaSdpa()
    functional.scaled_dot_product_attention = stand_in
    try:
        yield stand_in
    finally:
        functional.scaled_dot_product_attention = original
