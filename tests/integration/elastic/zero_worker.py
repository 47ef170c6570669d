"""A small ZeRO-1 job (Adam moments sharded over the data-parallel ranks), for the shrink test.

With plain DDP a smaller world with the same micro-batch needs the same memory per rank, so a
shrink can never OOM; with ZeRO each rank's optimizer shard doubles when the world halves. This
worker is the smallest honest ZeRO-1 on gloo: parameters and gradients live in one flat fp32
tensor each, gradients are averaged with chunked all-reduces, each rank runs Adam on its own
slice (moments sized P / world) and broadcasts it back. Checkpoints hold the full parameters and
every rank's moment slice; a resume at another world size re-slices them. The memory cap
(``memory_cap``, real allocator failures) is applied after start-up, resume of the parameters
and one dry micro-batch and collective (so the kernels', autograd's and gloo's first-use
allocations are paid before it, as in ``probe_zero.py``'s warm-up), and before the moments are
allocated, so the budget covers moments plus one step. Saved moments are read one tensor of one
slice at a time, so a resume under the cap needs no more than a step does.

Reads the dssup plan (micro-batch, accumulation, recompute) like ``examples/train_tiny.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional
from torch.utils.checkpoint import checkpoint

from dssup.runtime import clean_exit, memory_cap, read_plan
from dssup.runtime.process import status_bytes, vm_size_bytes

CHUNK = 1 << 20  # elements per all-reduce / broadcast: bounds gloo's temporary buffers


class Net(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)
        self.recompute = False

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        h = checkpoint(self.mlp, x, use_reentrant=False) if self.recompute else self.mlp(x)
        return self.head(x + h)


def flatten(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """One flat tensor for the parameters and one for their gradients (views into both)."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    flat, grad = torch.zeros(total), torch.zeros(total)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset : offset + n].copy_(p.data.reshape(-1))
        p.data = flat[offset : offset + n].view_as(p)
        p.grad = grad[offset : offset + n].view_as(p)
        offset += n
    return flat, grad


def bounds(total: int, rank: int, world: int) -> tuple[int, int]:
    per = -(-total // world)
    return min(rank * per, total), min((rank + 1) * per, total)


def chunks(t: torch.Tensor) -> list[torch.Tensor]:
    return [t[i : i + CHUNK] for i in range(0, t.numel(), CHUNK)]


def sample(seed: int, index: int, seq: int, vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randint(0, vocab, (seq + 1,), generator=gen)


def save(root: Path, step: int, flat: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    target = root / f"step_{step:08d}"
    target.mkdir(parents=True, exist_ok=True)
    torch.save(m, target / f"m_{rank}_of_{world}.pt")
    torch.save(v, target / f"v_{rank}_of_{world}.pt")
    if rank == 0:
        torch.save(flat, target / "params.pt")
    dist.barrier()
    if rank == 0:  # written last: the supervisor resumes only from directories that have it
        (target / ".metadata").write_text(json.dumps({"step": step, "world": world}))
    dist.barrier()


def load_params(path: Path, flat: torch.Tensor) -> int:
    """Before the cap: the parameters (they exist before the cap in a fresh start too)."""
    flat.copy_(torch.load(path / "params.pt"))
    return int(json.loads((path / ".metadata").read_text())["step"])


def load_moments(path: Path, m: torch.Tensor, v: torch.Tensor, lo: int, hi: int) -> None:
    """Under the cap, into shards allocated under the cap: each saved tensor of each slice is
    read in turn and its overlap with ``[lo, hi)`` copied, so a resume needs no more memory than
    a fresh start plus one saved tensor (half a slice at the old world: less than a step)."""
    old = json.loads((path / ".metadata").read_text())["world"]
    for name, shard in (("m", m), ("v", v)):
        offset = 0
        for r in range(old):
            part = torch.load(path / f"{name}_{r}_of_{old}.pt")
            n = part.numel()
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b:
                shard[a - lo : b - lo].copy_(part[a - offset : b - offset])
            offset += n
            del part


def dry_run(args: argparse.Namespace, model: nn.Module, grad: torch.Tensor, mb: int) -> None:
    """Before the cap: one micro-batch forward and backward at the plan's micro-batch and one
    chunk all-reduced and broadcast, so what the libraries allocate on first use (kernels'
    workspaces, autograd's, gloo's buffers) is not charged to the budget. Only ``grad`` is
    written, and every step zeroes it first."""
    micro_batch(args, model, 0, mb, mb * args.seq_len)
    head = grad[:CHUNK]
    dist.all_reduce(head)
    dist.broadcast(head, src=0)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--global-batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--memory-cap-mib", type=int, default=0)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, default=None, help="rank 0 saves the final parameters")
    return p.parse_args(argv)


def adam(flat: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
         step: int, lr: float) -> None:  # fmt: skip
    b1, b2, eps = 0.9, 0.999, 1e-8
    m.mul_(b1).add_(grad, alpha=1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (v / (1 - b2**step)).sqrt_().add_(eps)
    flat.addcdiv_(m, denom, value=-lr / (1 - b1**step))


def micro_batch(args: argparse.Namespace, model: nn.Module, first: int, mb: int,
                scale: int) -> None:  # fmt: skip
    """Forward and backward of ``mb`` samples from sample ``first``, the summed loss over
    ``scale`` (the rank's tokens in the step), gradients accumulated into the flat tensor."""
    rows = [sample(args.seed, first + i, args.seq_len, args.vocab) for i in range(mb)]
    data = torch.stack(rows)
    logits = model(data[:, :-1])
    total = functional.cross_entropy(
        logits.reshape(-1, args.vocab), data[:, 1:].reshape(-1), reduction="sum"
    )
    (total / scale).backward()


def train_step(args: argparse.Namespace, model: nn.Module, state: tuple[torch.Tensor, ...],
               first: int, step: int, share: int, mb: int, gas: int, world: int) -> None:  # fmt: skip
    """One optimizer step on this rank: ``gas`` micro-batches of ``mb`` samples from sample
    ``first``, the gradient all-reduce, Adam on this rank's slice, the slices broadcast back.
    With ``world`` 1 and no process group (a probe) the collectives are skipped."""
    flat, grad, m, v = state
    grad.zero_()
    for k in range(gas):
        micro_batch(args, model, first + k * mb, mb, share * args.seq_len)
    collective = dist.is_initialized()
    for c in chunks(grad) if collective else ():
        dist.all_reduce(c)
    grad.div_(world)
    lo, hi = bounds(flat.numel(), dist.get_rank() if collective else 0, world)
    adam(flat[lo:hi], grad[lo:hi], m, v, step + 1, args.lr)
    for r in range(world) if collective else ():
        a, b = bounds(flat.numel(), r, world)
        for c in chunks(flat[a:b]):
            dist.broadcast(c, src=r)


@record
def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    default_gas = max(1, args.global_batch_size // (world * args.micro_batch_size))
    plan = read_plan(args.micro_batch_size, default_gas, args.global_batch_size)
    gb = plan.global_batch or args.global_batch_size
    plan.check(world)
    share, mb, gas = gb // world, plan.micro_batch, plan.grad_accum
    torch.manual_seed(args.seed)
    model = Net(args.vocab, args.dim)
    model.recompute = plan.recompute != "none"
    flat, grad = flatten(model)
    lo, hi = bounds(flat.numel(), rank, world)
    start = load_params(plan.resume_from, flat) if plan.resume_from is not None else 0
    if args.memory_cap_mib:
        dry_run(args, model, grad, mb)
    vm_at_cap = vm_size_bytes()
    if args.memory_cap_mib:
        memory_cap(args.memory_cap_mib << 20)
    m, v = torch.zeros(hi - lo), torch.zeros(hi - lo)
    if plan.resume_from is not None:
        load_moments(plan.resume_from, m, v, lo, hi)
    log = {"rank": rank, "world": world, "mb": mb, "gas": gas, "gb": gb, "start": start,
           "shard": hi - lo, "recompute": plan.recompute}  # fmt: skip
    print("zero_worker start " + json.dumps(log), flush=True)
    for step in range(start, args.steps):
        train_step(args, model, (flat, grad, m, v), step * gb + rank * share, step, share, mb,
                   gas, world)  # fmt: skip
        if rank == 0:
            print(f"step {step} world {world} mb {mb} gas {gas}", flush=True)
        if plan.checkpoint_dir is not None:
            save(plan.checkpoint_dir, step + 1, flat, m, v)
        time.sleep(args.step_delay)
    if rank == 0 and args.out is not None:
        torch.save(flat, args.out)
    peak = status_bytes("VmPeak") - vm_at_cap
    print(f"zero_worker rank {rank} peak growth {peak / 2**20:.1f} MiB", flush=True)
    clean_exit(dist)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    sys.exit(main())
