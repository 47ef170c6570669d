"""RMSNorm, rotary embedding, SwiGLU and the two attention kinds, written the eager way.

Eager on purpose: RMSNorm computes in fp32 (as Llama/DeepSeek reference code does), SwiGLU keeps
both branch outputs, attention goes through ``scaled_dot_product_attention`` (the CPU flash
kernel: no s^2 scores, an fp32 log-sum-exp per query). What these store for backward is what
the ``eager`` profile of the memory model predicts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as nnf
from torch.utils.checkpoint import checkpoint

from dssup.memory import ModelSpec

__all__ = ["GQA", "MLA", "RMSNorm", "SwiGLU", "maybe_checkpoint", "rope_tables"]


def maybe_checkpoint(
    on: bool, fn: Callable[..., torch.Tensor], *args: torch.Tensor
) -> torch.Tensor:
    """Run ``fn`` under non-reentrant activation checkpointing when ``on``."""
    if on:
        # No dropout or other randomness in the model: stashing the RNG state would only add
        # 5 KB tensors per region that MemTracker does not see (the profiler does).
        out: torch.Tensor = checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)
        return out
    return fn(*args)


class RMSNorm(nn.Module):
    """y = w * (x / rms(x)), normalised in fp32 and cast back to the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_tables(seq: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [seq, dim] for rotate-half RoPE."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), the dense MLP and the shared expert."""

    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, inner, bias=False)
        self.w3 = nn.Linear(dim, inner, bias=False)
        self.w2 = nn.Linear(inner, dim, bias=False)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = nnf.silu(self.w1(x)) * self.w3(x)
        return out

    def forward(self, x: torch.Tensor, selective: bool = False) -> torch.Tensor:
        out: torch.Tensor = self.w2(maybe_checkpoint(selective, self.act, x))
        return out


class MLA(nn.Module):
    """Multi-head latent attention: compressed q (optional) and kv, decoupled RoPE key."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        a = m.mla
        if a is None:
            raise ValueError("MLA needs model.mla")
        h, nh = m.hidden, m.heads
        self.nh, self.dn, self.dr, self.dv, self.dc = (
            nh,
            a.qk_nope_head_dim,
            a.qk_rope_head_dim,
            a.v_head_dim,
            a.kv_lora_rank,
        )
        qdim = nh * (self.dn + self.dr)
        if a.q_lora_rank:
            self.wq_a = nn.Linear(h, a.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(a.q_lora_rank)
            self.wq_b = nn.Linear(a.q_lora_rank, qdim, bias=False)
        else:
            self.wq = nn.Linear(h, qdim, bias=False)
        self.wkv_a = nn.Linear(h, self.dc + self.dr, bias=False)
        self.kv_norm = RMSNorm(self.dc)
        self.wkv_b = nn.Linear(self.dc, nh * (self.dn + self.dv), bias=False)
        self.wo = nn.Linear(nh * self.dv, h, bias=False)

    def core(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Everything up to the attention output (what selective recompute reruns)."""
        b, s, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if hasattr(self, "wq_a") else self.wq(x)
        q = q.view(b, s, self.nh, self.dn + self.dr)
        kv, k_pe = self.wkv_a(x).split([self.dc, self.dr], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv)).view(b, s, self.nh, self.dn + self.dv)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)
        q_nope, q_pe = q.split([self.dn, self.dr], dim=-1)
        q_pe = _rope(q_pe.transpose(1, 2), cos, sin)
        k_pe = _rope(k_pe.unsqueeze(1), cos, sin).expand(b, self.nh, s, self.dr)
        q = torch.cat([q_nope.transpose(1, 2), q_pe], dim=-1)
        k = torch.cat([k_nope.transpose(1, 2), k_pe], dim=-1)
        v = v.transpose(1, 2)
        if self.dv != self.dn + self.dr:  # pad V so the flash kernel applies (as DeepSeek does)
            v = nnf.pad(v, (0, self.dn + self.dr - self.dv))
        o = nnf.scaled_dot_product_attention(q, k, v, is_causal=True)[..., : self.dv]
        return o.transpose(1, 2).reshape(b, s, self.nh * self.dv)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, selective: bool = False
    ) -> torch.Tensor:
        out: torch.Tensor = self.wo(maybe_checkpoint(selective, self.core, x, cos, sin))
        return out


class GQA(nn.Module):
    """Grouped-query attention with RoPE (Llama-style), optional q/k/v biases."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        h, d = m.hidden, m.head_dim
        self.nh, self.nkv, self.d = m.heads, m.kv_heads, d
        self.wq = nn.Linear(h, m.heads * d, bias=m.qkv_bias)
        self.wk = nn.Linear(h, m.kv_heads * d, bias=m.qkv_bias)
        self.wv = nn.Linear(h, m.kv_heads * d, bias=m.qkv_bias)
        self.wo = nn.Linear(m.heads * d, h, bias=False)

    def core(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = _rope(self.wq(x).view(b, s, self.nh, self.d).transpose(1, 2), cos, sin)
        k = _rope(self.wk(x).view(b, s, self.nkv, self.d).transpose(1, 2), cos, sin)
        v = self.wv(x).view(b, s, self.nkv, self.d).transpose(1, 2)
        o = nnf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.nkv < self.nh)
        return o.transpose(1, 2).reshape(b, s, self.nh * self.d)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, selective: bool = False
    ) -> torch.Tensor:
        out: torch.Tensor = self.wo(maybe_checkpoint(selective, self.core, x, cos, sin))
        return out
