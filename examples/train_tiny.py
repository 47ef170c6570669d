"""A tiny transformer trained with gloo on CPU, written the way dssup expects a real job to be.

It shows the whole contract (the last point is the tests' and the demo's stand-in for a GPU):

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
* a memory cap, the CPU stand-in for a full GPU, so a too-large micro-batch fails with a real
  ``DefaultCPUAllocator: can't allocate memory``: ``--memory-cap-at forward`` sizes rank N's
  "device" by what micro-batch 16 holds when the logits of step ``--memory-cap-step`` exist
  (``dssup.runtime.standin``: the same on any machine, and kept in ``--memory-cap-file`` for
  the attempts after), ``--memory-cap-mib`` gives a fixed budget instead. Either cap goes on
  after a dry micro-batch of one sample (forward and backward, gradients zeroed, weights and
  optimizer untouched), so the budget is what training allocates, not what the libraries
  allocate on first use (their buffers differ from one CPU to the next).

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
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional
from torch.utils.checkpoint import checkpoint

from dssup.runtime import clean_exit, memory_cap, read_plan
from dssup.runtime.checkpoint import load_checkpoint, save_checkpoint
from dssup.runtime.process import status_bytes
from dssup.runtime.report import report_checkpoint, report_started
from dssup.runtime.standin import DeviceStandIn

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
    p.add_argument("--memory-cap-mib", type=int, default=0,
                   help="cap the capped ranks' address space this far above their size after "
                   "the dry micro-batch (0 = no fixed cap)")  # fmt: skip
    p.add_argument("--memory-cap-at", choices=["forward", "backward"], default=None,
                   help="cap instead when, in step --memory-cap-step, the first micro-batch's "
                   "logits exist (forward) or its backward starts (backward): at the size there "
                   "plus 1 MiB, so the rest of that micro-batch fails and half of it fits")  # fmt: skip
    p.add_argument(
        "--memory-cap-step",
        type=int,
        default=None,
        help="the step of --memory-cap-at (default: --long-from-step)",
    )
    p.add_argument("--memory-cap-file", type=Path, default=None,
                   help="with --memory-cap-at: keep the budget found here ('{rank}' is replaced); "
                   "an attempt that finds the file caps at that budget from its start")  # fmt: skip
    p.add_argument("--memory-cap-ranks", default="all", help="'all' or comma-separated ranks")
    p.add_argument("--out", type=Path, default=None, help="rank 0 writes final weights here")
    p.add_argument("--reference", type=Path, default=None, help="single process; write weights")
    args = p.parse_args(argv)
    if args.memory_cap_mib and args.memory_cap_at:
        p.error("--memory-cap-mib and --memory-cap-at size the same cap two ways: give one")
    return args


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


def train_step(args, model, ddp, opt, step, rank, share, mb, gas, cap=None) -> float:  # type: ignore[no-untyped-def]
    seq = seq_len_at(args, step)
    first = step * args.global_batch_size + rank * share
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for m in range(gas):
        data = batch(args, first + m * mb, mb, seq)
        sync = nullcontext() if (ddp is None or m == gas - 1) else ddp.no_sync()
        with sync:
            if cap is not None:
                cap.micro_batch(step, m)
            logits = (ddp or model)(data[:, :-1])
            loss = functional.cross_entropy(
                logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1), reduction="sum"
            )
            loss = loss / (share * seq)
            if cap is not None:
                cap.watch(loss)
            loss.backward()
        total += float(loss.detach())
    opt.step()
    return total


class MemoryCap:
    """The ``--memory-cap-*`` flags on one rank (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.args, self.step, self.first = args, -1, False
        self.limit: int | None = None
        self.base: int | None = None
        self.filled = False  # sized at the named point: VmPeak then counts the failed try
        ranks = args.memory_cap_ranks
        self.capped = ranks == "all" or str(rank) in ranks.split(",")
        self.at_step = args.long_from_step if args.memory_cap_step is None else args.memory_cap_step
        self.device = DeviceStandIn(args.memory_cap_file) if args.memory_cap_at else None

    @property
    def wanted(self) -> bool:
        """Any cap on any rank: every rank then runs the dry micro-batch (it synchronises)."""
        return bool(self.args.memory_cap_mib or self.args.memory_cap_at)

    def start(self, model: nn.Module, dry: Any) -> None:
        """Before the first step: the dry micro-batch ``dry()`` on every rank, then the cap."""
        if not self.wanted:
            return
        dry()
        model.zero_grad(set_to_none=True)
        if not self.capped:
            return
        if self.device is None:
            self.limit = memory_cap(self.args.memory_cap_mib << 20)
            self.base = self.limit - (self.args.memory_cap_mib << 20)
            return
        self.limit = self.device.start()
        self.base = self.device.base if self.limit else None
        model.head.register_forward_hook(lambda *_: self._at("forward"))

    def summary(self) -> str | None:
        """How much of the "device" this rank used at most, for the logs, where the cap was on
        from the start (a fixed or a recorded budget): ``VmPeak`` above the cap's base (the dry
        micro-batch before the cap is counted too, so it is an upper bound). None otherwise."""
        if self.limit is None or self.base is None or self.filled:
            return None
        peak = status_bytes("VmPeak") - self.base
        return (f"memory cap: rank {os.environ.get('RANK', '0')} used at most "
                f"{peak / 2**20:.1f} of {(self.limit - self.base) / 2**20:.1f} MiB")  # fmt: skip

    def micro_batch(self, step: int, index: int) -> None:
        self.step, self.first = step, index == 0

    def watch(self, loss: torch.Tensor) -> None:
        """The loss of a micro-batch: its backward starts with this hook."""
        if self._due("backward"):
            loss.register_hook(lambda _grad: self._at("backward"))

    def _due(self, point: str) -> bool:
        d = self.device
        return (d is not None and d.pending and self.capped and self.first
                and self.step == self.at_step and self.args.memory_cap_at == point)  # fmt: skip

    def _at(self, point: str) -> None:
        if self._due(point) and self.device is not None:
            self.limit, self.base, self.filled = self.device.fill(), self.device.base, True
            print(f"memory cap: rank {os.environ.get('RANK', '0')} at {point} of step "
                  f"{self.step}: {(self.limit - (self.base or 0)) / 2**20:.1f} MiB above its "
                  "start", flush=True)  # fmt: skip


def own_kernels() -> None:
    """torch's own CPU kernels, not oneDNN's, in every run (the reference too: the same
    kernels, the same numbers). oneDNN (float GELU on CPU) builds a primitive for every new
    shape in memory of its own; under the address-space cap that fails as "could not create a
    primitive", a message that has lost its out-of-memory status, and how much memory a
    primitive takes depends on the CPU it is compiled for. The cap stands in for a GPU's
    limit: torch's own allocation failures say what they are."""
    torch.backends.mkldnn.enabled = False


def dry_micro_batch(args: argparse.Namespace, module: nn.Module, step: int) -> None:
    """One sample through forward and backward at ``step``'s sequence length: the kernels'
    and libraries' first use happens here, before a cap. The caller zeroes the gradients."""
    data = batch(args, 0, 1, seq_len_at(args, step))
    logits = module(data[:, :-1])
    functional.cross_entropy(logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1)).backward()


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
    own_kernels()
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
    cap = MemoryCap(args, rank)
    cap.start(model, lambda: dry_micro_batch(args, ddp, start))
    report_started(
        micro_batch=mb, grad_accum=gas, dp=world, global_batch=gb, first_step=start,
        resumed_from=plan.resume_from, recompute=plan.recompute,
    )  # fmt: skip
    log = {"rank": rank, "attempt": plan.attempt, "mb": mb, "gas": gas, "gb": gb, "start": start}
    print("train_tiny start " + json.dumps(log), flush=True)
    for step in range(start, args.steps):
        loss = train_step(args, model, ddp, opt, step, rank, share, mb, gas, cap)
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
    if (used := cap.summary()) is not None:
        print(used, flush=True)
    clean_exit(dist, step=args.steps)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    sys.exit(main())
