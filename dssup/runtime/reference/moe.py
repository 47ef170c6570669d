"""Mixture-of-experts feed-forward: softmax router, shared experts, top-k routed experts.

Two dispatch variants. ``capacity`` pads every expert to ``ceil(cf * tokens * k / E)`` slots
(static shapes: FakeTensorMode can trace it; overflowing token-slots are dropped). ``dropless``
gathers each expert's tokens with data-dependent shapes (the real-run truth, no drops; fake
mode cannot trace it). Routed experts are stored stacked ([E, h, f]) and run as batched matmuls.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as nnf

from dssup.memory import ModelSpec
from dssup.runtime.reference.layers import SwiGLU, maybe_checkpoint

__all__ = ["MoE"]


def _swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    return nnf.silu(x @ w1) * (x @ w3)


class MoE(nn.Module):
    """DeepSeek-style MoE layer (router over E experts, top-k, plus always-on shared experts)."""

    def __init__(self, m: ModelSpec, routing: str, capacity_factor: float) -> None:
        super().__init__()
        moe = m.moe
        if moe is None:
            raise ValueError("MoE needs model.moe")
        h, e, f = m.hidden, moe.n_routed, moe.expert_ffn
        self.e, self.k, self.routing, self.cf = e, moe.top_k, routing, capacity_factor
        self.router = nn.Linear(h, e, bias=False)
        self.router_bias = nn.Parameter(torch.zeros(e)) if moe.router_bias else None
        self.w1 = nn.Parameter(torch.randn(e, h, f) * h**-0.5)
        self.w3 = nn.Parameter(torch.randn(e, h, f) * h**-0.5)
        self.w2 = nn.Parameter(torch.randn(e, f, h) * f**-0.5)
        inner = moe.n_shared * moe.shared_ffn
        self.shared = SwiGLU(h, inner) if inner else None

    def capacity(self, tokens: int) -> int:
        return math.ceil(self.cf * tokens * self.k / self.e)

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.router(x).float().softmax(dim=-1)
        select = scores if self.router_bias is None else scores + self.router_bias
        idx = select.topk(self.k, dim=-1).indices
        return scores.gather(-1, idx), idx

    def _capacity(
        self, x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, sel: bool
    ) -> torch.Tensor:
        t, h = x.shape
        cap = self.capacity(t)
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.zeros(self.e, dtype=torch.long, device=x.device)
        counts = counts.scatter_add(0, flat, torch.ones_like(flat))
        starts = counts.cumsum(0) - counts
        pos = torch.arange(flat.numel(), device=x.device) - starts[flat[order]]
        slot = torch.where(pos < cap, flat[order] * cap + pos, self.e * cap)  # dropped -> dummy
        token = order // self.k
        buf = x.new_zeros(self.e * cap + 1, h).index_copy(0, slot, x[token])
        xe = buf[:-1].view(self.e, cap, h)
        a = maybe_checkpoint(sel, _swiglu, xe, self.w1.to(x.dtype), self.w3.to(x.dtype))
        ye = torch.cat([(a @ self.w2.to(x.dtype)).view(-1, h), x.new_zeros(1, h)])
        contrib = ye[slot] * w.reshape(-1)[order].unsqueeze(-1).to(x.dtype)
        return x.new_zeros(t, h).index_add(0, token, contrib)

    def _dropless(
        self, x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, sel: bool
    ) -> torch.Tensor:
        t, h = x.shape
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        token = order // self.k
        counts = torch.bincount(flat, minlength=self.e).tolist()
        xs = torch.split(x[token], counts)
        outs = []
        for i, xi in enumerate(xs):
            w1, w3, w2 = (p[i].to(x.dtype) for p in (self.w1, self.w3, self.w2))
            outs.append(maybe_checkpoint(sel, _swiglu, xi, w1, w3) @ w2)
        contrib = torch.cat(outs) * w.reshape(-1)[order].unsqueeze(-1).to(x.dtype)
        return x.new_zeros(t, h).index_add(0, token, contrib)

    def forward(self, x: torch.Tensor, selective: bool = False) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        w, idx = self._route(flat)
        routed = self._capacity if self.routing == "capacity" else self._dropless
        out = routed(flat, w, idx, selective)
        if self.shared is not None:
            out = out + self.shared(flat, selective)
        return out.view(b, s, h)
