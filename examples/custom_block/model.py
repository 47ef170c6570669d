"""A decoder whose block is not in any library: attention and MLP side by side (GPT-J/PaLM
"parallel" layout) over a shared residual, grouped-query attention with RoPE, SwiGLU.

dssup cannot know what this block stores for backward; it traces it::

    dssup calibrate --module custom_block.model:factory --module-path examples \\
        --seq-len 512 --dtype bf16 --out block.json
    dssup estimate --model examples/custom_block/config.json --calibration block.json \\
        --seq-len 512 --micro-batch 8 --tp 2 --zero 1 --dp 4 --gpu-memory 24GiB \\
        --dtypes weights=bf16,grads=bf16,master=none,moments=bf16   # the traced step's states

``factory()`` is all dssup needs: it returns the model and ``make_batch(micro_batch, seq_len)``,
whose dict is passed as ``model(**batch)``; the model returns the loss. Its sizes are the ones in
config.json (a Llama-style config the memory model reads for the parameter count, which it
checks against the traced one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as nnf

CONFIG = json.loads((Path(__file__).with_name("config.json")).read_text())


class ParallelBlock(nn.Module):
    """x + attention(norm1(x)) + mlp(norm2(x)): both branches read the same input."""

    def __init__(self, h: int, heads: int, kv_heads: int, head_dim: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.attn_norm, self.mlp_norm = nn.RMSNorm(h), nn.RMSNorm(h)
        self.q = nn.Linear(h, heads * head_dim, bias=False)
        self.k = nn.Linear(h, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(h, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, h, bias=False)
        self.gate = nn.Linear(h, ffn, bias=False)
        self.up = nn.Linear(h, ffn, bias=False)
        self.down = nn.Linear(ffn, h, bias=False)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = nnf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        y = self.mlp_norm(x)
        mlp = self.down(nnf.silu(self.gate(y)) * self.up(y))
        return x + self.attention(self.attn_norm(x), cos, sin) + mlp


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class ParallelLM(nn.Module):
    """Embedding, the blocks, final norm, untied head; ``forward`` returns the mean loss."""

    def __init__(self, c: dict[str, int]) -> None:
        super().__init__()
        h, heads = c["hidden_size"], c["num_attention_heads"]
        self.head_dim = c.get("head_dim", h // heads)
        self.embed = nn.Embedding(c["vocab_size"], h)
        self.blocks = nn.ModuleList(
            ParallelBlock(h, heads, c["num_key_value_heads"], self.head_dim, c["intermediate_size"])
            for _ in range(c["num_hidden_layers"])
        )
        self.norm = nn.RMSNorm(h)
        self.head = nn.Linear(h, c["vocab_size"], bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(s).float(), inv)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cos.to(x.dtype), sin.to(x.dtype))
        logits = self.head(self.norm(x)).float()
        return nnf.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def factory() -> tuple[nn.Module, Callable[[int, int], dict[str, torch.Tensor]]]:
    """What ``dssup calibrate/measure --module custom_block.model:factory`` calls."""
    vocab = CONFIG["vocab_size"]

    def make_batch(micro_batch: int, seq_len: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (micro_batch, seq_len))
        return {"input_ids": ids, "labels": ids}

    return ParallelLM(CONFIG), make_batch
