"""``examples/train_tiny.py`` with in-process OOM recovery: ``dssup.runtime.StepGuard``.

The same tiny transformer, data order, loss and checkpoints as ``train_tiny.py`` (imported from
it), but each optimizer step runs under the step guard: the guard is handed the rank's whole
share of the step and a loss function for one micro-batch. When a rank runs out of memory the
ranks agree, and the step is redone in-process at a finer split of the same global batch. No
restart, no lost step. The split then stays for the rest of the run. What cannot be redone in
this process (an OOM at micro-batch 1, a peer that died) ends the worker with status 75, and
``dssup run`` takes over: it restarts from the split the job had moved to, from the last
complete checkpoint.

Run it under dssup, with rank 1's memory capped at what micro-batch 16 holds when the logits
of step 4 (the first long-sequence step) exist, so the rest of that micro-batch does not fit
(``--memory-cap-at``, see train_tiny)::

    dssup run --global-batch-size 32 --micro-batch-size 16 --checkpoint-dir ckpt -- \\
        torchrun --standalone --nproc-per-node 2 examples/train_guarded.py \\
        --memory-cap-at forward --memory-cap-ranks 1 --out final.pt

``--fsdp`` shards the model with FSDP2 (``fully_shard``) instead of DDP; ``--sync`` picks how the
guard synchronises gradients (``auto``: deferred for DDP, last for FSDP2). ``--reference OUT``
trains in one process without the guard: the weights a run that never failed ends with.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_tiny as tiny

from dssup.runtime import StepGuard, clean_exit, read_plan
from dssup.runtime.checkpoint import load_checkpoint, save_checkpoint
from dssup.runtime.report import report_checkpoint, report_started


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--sync", default="auto", choices=["auto", "deferred", "last"])
    own.add_argument("--fsdp", action="store_true", help="FSDP2 instead of DDP")
    own.add_argument("--min-micro-batch", type=int, default=1)
    known, rest = own.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        own.print_help()
    args = tiny.parse_args(rest)
    return argparse.Namespace(**vars(args), **vars(known))


def wrap(args: argparse.Namespace, model: nn.Module) -> nn.Module:
    if not args.fsdp:
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def loss_of(args: argparse.Namespace, model: nn.Module, share: int, seq: int,
            cap: tiny.MemoryCap, step: int):  # type: ignore[no-untyped-def]  # fmt: skip
    """The loss of one micro-batch: a token sum over the rank's share, as in train_tiny, so
    the guard adds micro-batches up unweighted (``loss_reduction="sum"``). The memory cap is
    told which micro-batch of which step runs (its named point is in the step's first)."""
    calls = itertools.count()

    def loss_fn(micro: torch.Tensor) -> torch.Tensor:
        cap.micro_batch(step, next(calls))
        logits = model(micro[:, :-1])
        loss = functional.cross_entropy(
            logits.reshape(-1, tiny.VOCAB), micro[:, 1:].reshape(-1), reduction="sum"
        )
        cap.watch(loss)
        return loss / (share * seq)

    return loss_fn


@record
def main() -> None:
    args = parse_args()
    tiny.own_kernels()
    if args.reference is not None:
        tiny.reference(args)
        return
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = read_plan(
        args.micro_batch_size, args.gradient_accumulation_steps, args.global_batch_size
    )
    gb = args.global_batch_size = plan.global_batch or args.global_batch_size
    share = gb // world
    model, opt = tiny.build(args)
    model.recompute = plan.recompute != "none"
    wrapped = wrap(args, model)
    if args.fsdp:  # FSDP2 shards the parameters: build the optimizer over the shards
        opt = torch.optim.AdamW(wrapped.parameters(), lr=args.lr)
    start = load_checkpoint(plan.resume_from, wrapped, opt) if plan.resume_from else 0
    guard = StepGuard(
        wrapped, opt, global_batch=gb, micro_batch=plan.micro_batch, dp=world, step=start,
        loss_reduction="sum", sync=args.sync, min_micro_batch=args.min_micro_batch,
    )  # fmt: skip
    cap = tiny.MemoryCap(args, rank)
    cap.start(model, lambda: tiny.dry_micro_batch(args, wrapped, start))
    report_started(
        micro_batch=guard.micro_batch, grad_accum=guard.grad_accum, dp=world, global_batch=gb,
        first_step=start, resumed_from=plan.resume_from, recompute=plan.recompute,
    )  # fmt: skip
    info = {"rank": rank, "attempt": plan.attempt, "mb": guard.micro_batch, "start": start}
    print("train_guarded start " + json.dumps(info), flush=True)
    root = plan.checkpoint_dir or args.checkpoint_dir
    for step in range(start, args.steps):
        seq = tiny.seq_len_at(args, step)
        data = tiny.batch(args, step * gb + rank * share, share, seq)
        result = guard.step(data, loss_of(args, wrapped, share, seq, cap, step))
        if rank == 0:
            print(f"step {step} seq {seq} mb {result.micro_batch} tries {result.tries} "
                  f"loss {float(result.loss):.4f}", flush=True)  # fmt: skip
        done = step + 1
        if root is not None and (done % args.checkpoint_every == 0 or done == args.steps):
            path = save_checkpoint(root, done, wrapped, opt)
            if rank == 0:
                report_checkpoint(done, path)
    if args.out is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = StateDictOptions(full_state_dict=True)  # collective under FSDP2: every rank
        state = get_model_state_dict(wrapped, options=full)
        if rank == 0:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, args.out)
    clean_exit(dist, step=args.steps)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    sys.exit(main())
