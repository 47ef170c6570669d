"""The decoder: embedding, blocks (attention + dense or MoE FFN), final norm, head, fp32 loss.

Recompute levels mirror the memory model's: ``full`` checkpoints every block (only its input is
kept), ``selective`` reruns each block's norms, up-projections and attention core, and the
SwiGLU gates of dense, shared and routed experts. MTP (DeepSeek-V3) adds ``mtp_depth`` modules,
each ``proj(cat(norm(h), norm(embed(tokens shifted))))`` -> block -> the shared norm and head.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as nnf

from dssup.memory import ModelSpec
from dssup.runtime.reference.config import RunSpec
from dssup.runtime.reference.layers import GQA, MLA, RMSNorm, SwiGLU, maybe_checkpoint, rope_tables
from dssup.runtime.reference.moe import MoE

__all__ = ["Block", "ReferenceModel", "build_model"]


def _rope_dim(m: ModelSpec) -> int:
    return m.mla.qk_rope_head_dim if m.mla is not None else m.head_dim


class Block(nn.Module):
    """One transformer layer: pre-norm attention and pre-norm FFN with residuals."""

    def __init__(self, m: ModelSpec, moe: bool, run: RunSpec) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(m.hidden)
        self.attn: MLA | GQA = MLA(m) if m.mla is not None else GQA(m)
        self.ffn_norm = RMSNorm(m.hidden)
        self.ffn: MoE | SwiGLU = (
            MoE(m, run.moe_routing, run.capacity_factor) if moe else SwiGLU(m.hidden, m.ffn)
        )
        self.selective = run.recompute == "selective"

    def _attn_core(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.attn.core(self.attn_norm(x), cos, sin)

    def _mlp_act(self, x: torch.Tensor) -> torch.Tensor:
        assert isinstance(self.ffn, SwiGLU)
        out: torch.Tensor = self.ffn.act(self.ffn_norm(x))
        return out

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        sel = self.selective
        x = x + self.attn.wo(maybe_checkpoint(sel, self._attn_core, x, cos, sin))
        if isinstance(self.ffn, SwiGLU):
            out: torch.Tensor = x + self.ffn.w2(maybe_checkpoint(sel, self._mlp_act, x))
        else:
            out = x + self.ffn(self.ffn_norm(x), sel)
        return out


class MTPModule(nn.Module):
    """One multi-token-prediction depth: two norms, the [h, 2h] projection and a block."""

    def __init__(self, m: ModelSpec, run: RunSpec) -> None:
        super().__init__()
        self.hnorm = RMSNorm(m.hidden)
        self.enorm = RMSNorm(m.hidden)
        self.proj = nn.Linear(2 * m.hidden, m.hidden, bias=False)
        self.block = Block(m, m.moe is not None, run)


class ReferenceModel(nn.Module):
    """The whole model; ``forward(tokens)`` returns the mean next-token loss (plus MTP losses)."""

    def __init__(self, run: RunSpec) -> None:
        super().__init__()
        m = run.model
        self.spec, self.full = m, run.recompute == "full"
        self.embed = nn.Embedding(m.vocab, m.hidden)
        self.layers = nn.ModuleList(Block(m, m.is_moe_layer(i), run) for i in range(m.layers))
        self.norm = RMSNorm(m.hidden)
        self.head = None if m.tie_embeddings else nn.Linear(m.hidden, m.vocab, bias=False)
        self.mtp = nn.ModuleList(MTPModule(m, run) for _ in range(m.mtp_depth))
        cos, sin = rope_tables(run.seq_len, _rope_dim(m))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _block(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.get_buffer("cos"), self.get_buffer("sin")
        return maybe_checkpoint(self.full, block, x, cos, sin)

    def _loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        w = self.embed.weight if self.head is None else self.head.weight
        logits = nnf.linear(self.norm(x), w)
        loss: torch.Tensor = nnf.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return loss

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = self._block(block, x)
        targets = tokens.roll(-1, dims=1)
        loss = self._loss(x, targets)
        for depth, mod in enumerate(self.mtp, start=1):
            assert isinstance(mod, MTPModule)
            shifted = self.embed(tokens.roll(-depth, dims=1))
            x = mod.proj(torch.cat([mod.hnorm(x), mod.enorm(shifted)], dim=-1))
            x = self._block(mod.block, x)
            loss = loss + self._loss(x, tokens.roll(-depth - 1, dims=1)) / len(self.mtp)
        return loss


def build_model(run: RunSpec, device: str | torch.device = "cpu") -> ReferenceModel:
    """The reference model for ``run``, created directly in the run's parameter dtype on
    ``device`` (no conversion afterwards: FakeTensorMode cannot swap converted parameters)."""
    torch.manual_seed(run.seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if run.dtype == "bf16" else torch.float32)
    try:
        with torch.device(device):
            return ReferenceModel(run)
    finally:
        torch.set_default_dtype(old)
