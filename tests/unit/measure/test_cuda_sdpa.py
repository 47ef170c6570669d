"""Calibration traces attention as CUDA runs it: no CPU-only math-path tensors (issue 36).

The CPU's SDPA takes the math path when q/k and v head dims differ (MLA) and keeps the s x s
probabilities in FP32; CUDA's takes the memory-efficient kernel, which keeps an FP32
log-sum-exp per query and head. A trace with ``kernels="cuda"`` must hold the latter: the
saved tensors come from the CUDA operators' own meta rules and derivative formulas.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from dssup.runtime.traced.cudasdpa import choose, cuda_sdpa  # noqa: E402


def _qkv(d_qk: int, d_v: int, dtype: torch.dtype, kv_heads: int = 8) -> tuple[torch.Tensor, ...]:
    q = torch.empty(2, 8, 512, d_qk, dtype=dtype, requires_grad=True)
    k = torch.empty(2, kv_heads, 512, d_qk, dtype=dtype, requires_grad=True)
    v = torch.empty(2, kv_heads, 512, d_v, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize(
    ("d_qk", "d_v", "dtype", "kv", "mask", "kernel"),
    [
        (128, 128, torch.bfloat16, 8, False, "flash"),  # Llama
        (128, 128, torch.bfloat16, 2, False, "flash"),  # GQA: flash takes it
        (192, 128, torch.bfloat16, 8, False, "efficient"),  # MLA (DeepSeek V2/V3)
        (128, 128, torch.float32, 8, False, "efficient"),  # FP32: no flash
        (128, 128, torch.bfloat16, 8, True, "efficient"),  # a mask: no flash
        (192, 128, torch.bfloat16, 2, False, "math"),  # GQA without flash
        (100, 100, torch.float32, 8, False, "efficient"),  # 100 % 4 == 0
        (98, 98, torch.float32, 8, False, "math"),  # unaligned
    ],
)
def test_the_kernel_cuda_picks(d_qk, d_v, dtype, kv, mask, kernel) -> None:
    with FakeTensorMode():
        q, k, v = _qkv(d_qk, d_v, dtype, kv)
        m = torch.ones(512, 512, dtype=torch.bool) if mask else None
        assert choose(q, k, v, m)[0] == kernel


def _saved_bytes(kernels: str) -> int:
    """Bytes autograd keeps for the backward of one MLA attention call."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with FakeTensorMode():
        q, k, v = _qkv(192, 128, torch.bfloat16)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if kernels == "cuda":
                with cuda_sdpa() as mode:
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                assert list(mode.used) == [
                    "memory-efficient kernel (not flash: head dims q/k/v 192/192/128)"
                ]
            else:
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
    seen: dict[int, int] = {}
    for t in saved:  # a tensor saved twice is held once
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def test_mla_trace_keeps_no_probabilities_with_cuda_kernels() -> None:
    b, h, s = 2, 8, 512
    probs = b * h * s * s * 4  # the FP32 probabilities of the CPU's math path
    qkv_out = b * h * s * (192 + 192 + 128 + 128) * 2
    lse = b * h * s * 4
    cuda = _saved_bytes("cuda")
    assert qkv_out + lse <= cuda <= qkv_out + lse + 64  # + the philox seed and offset
    assert _saved_bytes("cpu") >= probs  # what the CPU keeps instead


def test_the_stand_in_is_removed_after_the_trace() -> None:
    before = torch.nn.functional.scaled_dot_product_attention
    with cuda_sdpa():
        assert torch.nn.functional.scaled_dot_product_attention is not before
    assert torch.nn.functional.scaled_dot_product_attention is before
