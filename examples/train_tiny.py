"""A tiny transformer trained with gloo on CPU, written the way dssup expects a real job to be.

It shows the whole contract in ~200 lines:

* the plan comes from ``dssup.runtime.read_plan`` (``DSSUP_MICRO_BATCH_SIZE``, ...) with the
  script's own flags as defaults, so it runs the same with and without ``dssup run``;
* it reports what it really trains with (``dssup.runtime.report``: micro-batch, accumulation,
  global batch, the step it resumes from, each checkpoint, completion), so dssup can say the
  global batch was verified by the job;
* the data order depends only on the global step and the global batch, never on the
  micro-batch: step ``s`` consumes samples ``[s*GB, (s+1)*GB)``, each rank its contiguous share,
  so a run resumed at a smaller micro-batch sees exactly the same samples;
* the loss is a token *sum* divided by the rank's share, so gradients are the same whatever the
  micro-batch / accumulation split;
* torch DCP checkpoints every ``--checkpoint-every`` steps (optimizer moments included);
* a sequence-length warm-up (short sequences first, ``--long-seq-len`` from
  ``--long-from-step``): the usual way a job that started fine OOMs later;
* ``--memory-cap-mib`` caps each worker's address space, so a too-large micro-batch fails with
  a real ``DefaultCPUAllocator: can't allocate memory`` (the CPU stand-in for CUDA OOM).

Run it with ``torchrun --standalone --nproc-per-node 2 examples/train_tiny.py --help``, or
without torchrun with ``--reference OUT`` (one process computes the same global batch: the
weights a run that never failed ends with).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional
from torch.utils.checkpoint import checkpoint

from dssup.runtime import clean_exit, memory_cap, read_plan
from dssup.runtime.checkpoint import load_checkpoint, save_checkpoint
from dssup.runtime.report import report_checkpoint, report_started

VOCAB = 256


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, dim: int, layers: int, heads: int, max_seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, VOCAB)
        self.recompute = False

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.recompute else block(x)
        return self.head(x)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--micro-batch-size", type=int, default=16)
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--global-batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--checkpoint-dir", type=Path, default=None)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--long-seq-len", type=int, default=384)
    p.add_argument("--long-from-step", type=int, default=4)
    p.add_argument("--model-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--memory-cap-mib", type=int, default=0, help="0 = no cap")
    p.add_argument("--memory-cap-ranks", default="all", help="'all' or comma-separated ranks")
    p.add_argument("--out", type=Path, default=None, help="rank 0 writes final weights here")
    p.add_argument("--reference", type=Path, default=None, help="single process; write weights")
    return p.parse_args(argv)


def seq_len_at(args: argparse.Namespace, step: int) -> int:
    return args.long_seq_len if step >= args.long_from_step else args.seq_len


def batch(args: argparse.Namespace, first: int, count: int, seq: int) -> torch.Tensor:
    """Samples ``first .. first+count-1``: each a function of its index alone."""
    rows = []
    for index in range(first, first + count):
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + index)
        rows.append(torch.randint(0, VOCAB, (seq + 1,), generator=gen))
    return torch.stack(rows)


def build(args: argparse.Namespace) -> tuple[TinyLM, torch.optim.Optimizer]:
    torch.manual_seed(args.seed)
    model = TinyLM(args.model_dim, args.layers, args.heads, max(args.seq_len, args.long_seq_len))
    return model, torch.optim.AdamW(model.parameters(), lr=args.lr)


def train_step(args, model, ddp, opt, step, rank, share, mb, gas) -> float:  # type: ignore[no-untyped-def]
    seq = seq_len_at(args, step)
    first = step * args.global_batch_size + rank * share
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for m in range(gas):
        data = batch(args, first + m * mb, mb, seq)
        sync = nullcontext() if (ddp is None or m == gas - 1) else ddp.no_sync()
        with sync:
            logits = (ddp or model)(data[:, :-1])
            loss = functional.cross_entropy(
                logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1), reduction="sum"
            )
            loss = loss / (share * seq)
            loss.backward()
        total += float(loss.detach())
    opt.step()
    return total


def reference(args: argparse.Namespace) -> None:
    """What a run that never failed ends with: one process, the whole global batch per step."""
    model, opt = build(args)
    gb = args.global_batch_size
    for step in range(args.steps):
        train_step(
            args, model, None, opt, step, 0, gb, args.micro_batch_size, gb // args.micro_batch_size
        )
    args.reference.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.reference)


@record
def main() -> None:
    args = parse_args()
    if args.reference is not None:
        reference(args)
        return
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = read_plan(
        args.micro_batch_size, args.gradient_accumulation_steps, args.global_batch_size
    )
    gb = plan.global_batch or args.global_batch_size
    args.global_batch_size = gb
    plan.check(world) if plan.global_batch else None
    share = gb // world
    mb, gas = plan.micro_batch, plan.grad_accum
    if mb * gas != share:
        raise ValueError(f"micro-batch {mb} x accumulation {gas} != {share} samples per rank")
    ckpt_root = plan.checkpoint_dir or args.checkpoint_dir
    model, opt = build(args)
    model.recompute = plan.recompute != "none"
    ddp = nn.parallel.DistributedDataParallel(model)
    start = 0
    if plan.resume_from is not None:
        start = load_checkpoint(plan.resume_from, ddp, opt)
    capped = args.memory_cap_ranks == "all" or str(rank) in args.memory_cap_ranks.split(",")
    if args.memory_cap_mib and capped:
        memory_cap(args.memory_cap_mib << 20)
    report_started(
        micro_batch=mb, grad_accum=gas, dp=world, global_batch=gb, first_step=start,
        resumed_from=plan.resume_from, recompute=plan.recompute,
    )  # fmt: skip
    log = {"rank": rank, "attempt": plan.attempt, "mb": mb, "gas": gas, "gb": gb, "start": start}
    print("train_tiny start " + json.dumps(log), flush=True)
    for step in range(start, args.steps):
        loss = train_step(args, model, ddp, opt, step, rank, share, mb, gas)
        if rank == 0:
            print(f"step {step} seq {seq_len_at(args, step)} loss {loss:.4f}", flush=True)
        done = step + 1
        if ckpt_root is not None and (done % args.checkpoint_every == 0 or done == args.steps):
            path = save_checkpoint(ckpt_root, done, ddp, opt)
            if rank == 0:
                report_checkpoint(done, path)
    if rank == 0 and args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out)
        print(f"train_tiny done at {time.strftime('%H:%M:%S')} weights {args.out}", flush=True)
    clean_exit(dist, step=args.steps)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    sys.exit(main())
