"""The bench job for ``bench/inprocess_recovery.py``: train_tiny's model and data, four ways.

``--mode guard``       each step under ``dssup.runtime.StepGuard`` (in-process recovery);
``--mode plain``       train_tiny's own loop (DDP, ``no_sync`` but for the last micro-batch),
                       resuming from the newest complete checkpoint in ``--checkpoint-dir``;
                       with ``--halve-on-restart`` it halves its micro-batch on every torchrun
                       restart (``TORCHELASTIC_RESTART_COUNT``), as a user of
                       ``torchrun --max-restarts`` would have to write by hand;
``--mode accelerate``  the training function under accelerate's own
                       ``find_executable_batch_size`` (1.15): on an OOM the function is rerun
                       from the top with a smaller batch, each process on its own, accumulation
                       untouched;
``--mode overhead``    no failure: interleaves steps of the plain loop and of the guard
                       (deferred and last) on the same model and data, and prints the times.

Every rank appends events to ``$BENCH_EVENTS`` (one JSON line each): ``oom`` when an
allocation fails (the exception is re-raised), ``step`` when an optimizer step completes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_guarded as guarded
import train_tiny as tiny

from dssup.runtime import StepGuard, clean_exit, read_plan
from dssup.runtime.agree import Code
from dssup.runtime.checkpoint import load_checkpoint, save_checkpoint
from dssup.runtime.oom import is_oom


def event(kind: str, **fields: object) -> None:
    path = os.environ.get("BENCH_EVENTS")
    if path:
        line = json.dumps(
            {"event": kind, "t": time.time(), "rank": int(os.environ.get("RANK", "0")), **fields}
        )
        with open(path, "a") as fh:
            fh.write(line + "\n")


def parse() -> argparse.Namespace:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--mode", choices=["guard", "plain", "accelerate", "overhead"], required=True)
    own.add_argument("--halve-on-restart", action="store_true")
    own.add_argument("--pairs", type=int, default=20)
    known, rest = own.parse_known_args()
    return argparse.Namespace(**vars(tiny.parse_args(rest)), **vars(known))


def latest(root: Path | None) -> Path | None:
    done = sorted(p for p in (root.glob("step_*") if root else []) if (p / ".metadata").exists())
    return done[-1] if done else None


def loss_fn(args, model, share, seq, cap, step):  # type: ignore[no-untyped-def]
    """train_guarded's loss of one micro-batch (``cap`` sized at the step's first one), with
    the bench's ``oom`` event when it fails."""
    loss_of = guarded.loss_of(args, model, share, seq, cap, step)

    def fn(micro: torch.Tensor) -> torch.Tensor:
        try:
            return loss_of(micro)
        except Exception as exc:
            if is_oom(exc):
                event("oom", phase="forward", step=step)
            raise

    return fn


def plain_step(args, model, ddp, opt, step, rank, share, mb, gas, cap) -> None:  # type: ignore[no-untyped-def]
    try:
        tiny.train_step(args, model, ddp, opt, step, rank, share, mb, gas, cap)
    except Exception as exc:
        if is_oom(exc):
            event("oom", phase="step", step=step)
        raise


def setup(args: argparse.Namespace, mb_default: int):  # type: ignore[no-untyped-def]
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = read_plan(
        args.micro_batch_size, args.gradient_accumulation_steps, args.global_batch_size
    )
    gb = args.global_batch_size = plan.global_batch or args.global_batch_size
    model, opt = tiny.build(args)
    ddp = nn.parallel.DistributedDataParallel(model)
    root = plan.checkpoint_dir or args.checkpoint_dir
    resume = plan.resume_from or latest(root)
    start = load_checkpoint(resume, ddp, opt) if resume else 0
    return rank, world, plan, gb, model, ddp, opt, root, start


def cap(args: argparse.Namespace, rank: int, model: nn.Module, ddp: nn.Module, step: int):  # type: ignore[no-untyped-def]
    """train_tiny's ``--memory-cap-*`` on this rank: a dry micro-batch at ``step``'s length on
    every rank, then the cap (``--memory-cap-at``: the device is what the failing micro-batch
    holds at the named point, kept in ``--memory-cap-file`` for every later try)."""
    guard = tiny.MemoryCap(args, rank)
    guard.start(model, lambda: tiny.dry_micro_batch(args, ddp, step))
    return guard


def run(args: argparse.Namespace) -> None:
    rank, world, plan, gb, model, ddp, opt, root, start = setup(args, args.micro_batch_size)
    share = gb // world
    mb = plan.micro_batch
    if args.halve_on_restart:
        mb = max(1, mb >> int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    guard = None
    if args.mode == "guard":
        guard = StepGuard(
            ddp, opt, global_batch=gb, micro_batch=mb, step=start, loss_reduction="sum"
        )
    device = cap(args, rank, model, ddp, start)
    for step in range(start, args.steps):
        seq = tiny.seq_len_at(args, step)
        if guard is not None:
            data = tiny.batch(args, step * gb + rank * share, share, seq)
            guard.step(data, loss_fn(args, ddp, share, seq, device, step))
            mb = guard.micro_batch
        else:
            plain_step(args, model, ddp, opt, step, rank, share, mb, share // mb, device)
        event(
            "step",
            step=step,
            mb=mb,
            gb=gb,
            attempt=os.environ.get("DSSUP_ATTEMPT", os.environ.get("TORCHELASTIC_RESTART_COUNT")),
        )
        done = step + 1
        if root is not None and (done % args.checkpoint_every == 0 or done == args.steps):
            save_checkpoint(root, done, ddp, opt)
    clean_exit(dist, step=args.steps)


def run_accelerate(args: argparse.Namespace) -> None:
    from accelerate.utils import find_executable_batch_size

    rank, world = dist.get_rank(), dist.get_world_size()

    @find_executable_batch_size(starting_batch_size=args.micro_batch_size)
    def train(batch_size: int) -> None:
        model, opt = tiny.build(args)
        ddp = nn.parallel.DistributedDataParallel(model)
        device = cap(args, rank, model, ddp, 0)
        gb = batch_size * world  # accumulation untouched: the global batch follows the batch
        for step in range(args.steps):
            plain_step(args, model, ddp, opt, step, rank, batch_size, batch_size, 1, device)
            event("step", step=step, mb=batch_size, gb=gb)

    train()
    clean_exit(dist, step=args.steps)


class _Clock:
    """Time spent in the user's work inside a guarded step (forward, backward, optimizer,
    gradient all-reduce) and in the verdict exchange (mostly waiting for the slower rank, a
    wait the plain loop has in its all-reduce): the rest of the step is the guard's own
    bookkeeping. The exchange's own cost is measured alone, with both ranks ready. ``parts``
    keeps each kind of work apart, to show where a difference between the loops comes from."""

    def __init__(self) -> None:
        self.work = 0.0
        self.parts: dict[str, float] = {}

    def timed(self, fn, part: str):  # type: ignore[no-untyped-def]
        def inner(*a, **k):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent = time.perf_counter() - t0
                self.work += spent
                self.parts[part] = self.parts.get(part, 0.0) + spent

        return inner


def overhead(args: argparse.Namespace) -> None:
    """Steps of the plain loop (twice: the noise floor) and of the guard, interleaved."""
    rank, world, plan, gb, _model, ddp, opt, _root, _start = setup(args, args.micro_batch_size)
    share, mb = gb // world, plan.micro_batch
    seq = args.long_seq_len
    data = tiny.batch(args, rank * share, share, seq)
    clock = _Clock()
    inert = tiny.MemoryCap(args, rank)  # no --memory-cap-* here: it caps nothing
    fn = clock.timed(loss_fn(args, ddp, share, seq, inert, 0), "forward")
    backward = clock.timed(lambda loss: loss.backward(), "backward (plain: + overlapped sync)")
    guards = {}
    for sync in ("deferred", "last"):
        g = StepGuard(ddp, opt, global_batch=gb, micro_batch=mb, loss_reduction="sum", sync=sync,
                      backward=backward)  # fmt: skip
        g.sync.reduce = clock.timed(g.sync.reduce, "gradient sync")  # type: ignore[method-assign]
        # waiting for the slower rank's verdict: the plain loop waits as long in its all-reduce
        g.agreement.exchange = clock.timed(g.agreement.exchange, "verdict")  # type: ignore[method-assign]
        guards[sync] = g
    opt.step = clock.timed(opt.step, "optimizer")  # type: ignore[method-assign]

    def plain() -> None:
        opt.zero_grad(set_to_none=True)
        for m in range(share // mb):
            with nullcontext() if m == share // mb - 1 else ddp.no_sync():
                backward(fn(data[m * mb : (m + 1) * mb]))
        opt.step()

    runs = {"plain": plain, "plain (again: noise floor)": plain,
            "guard deferred": lambda: guards["deferred"].step(data, fn),
            "guard last": lambda: guards["last"].step(data, fn)}  # fmt: skip
    names = list(runs)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    own: dict[str, list[float]] = {n: [] for n in names}
    parts: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for name in names:  # warm-up: first-call costs out of the figures
        runs[name]()
    for i in range(args.pairs):
        for name in names[i % 4 :] + names[: i % 4]:
            dist.barrier()
            clock.work, clock.parts = 0.0, {}
            t0, c0 = time.perf_counter(), time.process_time()
            runs[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            own[name].append(wall[name][-1] - clock.work)
            for part, spent in clock.parts.items():
                parts[name].setdefault(part, []).append(spent)
    verdict = []
    for _ in range(200):
        t0 = time.perf_counter()
        guards["deferred"].agreement.exchange(Code.OK, 30.0)
        verdict.append(time.perf_counter() - t0)

    def ratio(series: dict[str, list[float]], n: str) -> float:
        return statistics.median(a / b for a, b in zip(series[n], series["plain"], strict=True))

    if rank == 0:
        print("OVERHEAD " + json.dumps({
            "median_s": {n: statistics.median(v) for n, v in wall.items()},
            "wall_ratio": {n: ratio(wall, n) for n in names},
            "cpu_ratio": {n: ratio(cpu, n) for n in names},
            "own_s": {n: statistics.median(own[n]) for n in names},
            "parts_s": {n: {k: statistics.median(v) for k, v in parts[n].items()} for n in names},
            "verdict_exchange_s": statistics.median(verdict),
            "micro_batch": mb, "grad_accum": share // mb, "seq": seq, "pairs": args.pairs,
        }), flush=True)  # fmt: skip
    clean_exit(dist)


@record
def main() -> None:
    args = parse()
    # torch's own kernels only, as in examples/train_guarded.py: oneDNN's primitive creation
    # fails under the address-space cap with a message that has lost its out-of-memory status
    torch.backends.mkldnn.enabled = False
    dist.init_process_group("gloo")
    {"accelerate": run_accelerate, "overhead": overhead}.get(args.mode, run)(args)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    main()
