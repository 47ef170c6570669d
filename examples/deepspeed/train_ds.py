"""A tiny DeepSpeed training job that dssup can stop, reconfigure and resume.

Why it exists: the DeepSpeed remedies (ZeRO stage, offload, recompute) only count if a real
DeepSpeed engine trains, checkpoints, dies and resumes under a rewritten JSON. This script is
that job at toy scale: an MLP on a fixed synthetic data set, gloo on CPU (or NCCL on a GPU), any
number of ranks. It reads everything that may change between attempts from its DeepSpeed JSON
(batch triple, ZeRO stage, offload, ``activation_checkpointing``) and the dssup environment
contract (``DSSUP_RESUME_FROM``), so dssup can steer it without touching the code.

Sample ``i`` of the data set is the same on every attempt, and optimizer step ``s`` consumes
samples ``[s*GB, (s+1)*GB)`` whatever the micro-batch, accumulation or data-parallel size: a
resumed run continues at the next unseen sample. Rank 0 prints one machine-readable line per
event, ``DSSUP_DS <json>`` with ``event`` = ``engine`` (the engine's reported config),
``loaded``, ``step`` (loss as an exact float, global samples) and ``saved``.

    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 examples/deepspeed/train_ds.py \
        --deepspeed_config ds.json --steps 8 --save-dir ckpt --save-every 2
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.checkpoint import checkpoint

os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
from ds_memory import MemoryCapAt, state_digest, vm_bytes

from dssup.runtime.report import report_checkpoint, report_completed, report_started

DATA_SEED = 1234
MODEL_SEED = 42


def emit(event: str, **fields: Any) -> None:
    """One ``DSSUP_DS {json}`` line on rank 0: the script's machine-readable output."""
    if dist.get_rank() == 0:
        print("DSSUP_DS " + json.dumps({"event": event, **fields}), flush=True)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class TinyNet(nn.Module):
    """Residual MLP; ``recompute`` re-runs each block in backward instead of storing it."""

    def __init__(self, d_in: int, width: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 1)
        self.recompute = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            # use_reentrant=False: deepspeed.checkpointing drops parameter gradients when the
            # block input does not require grad (see docs/deepspeed.md).
            h = checkpoint(block, h, use_reentrant=False) if self.recompute else block(h)
        return self.out(h).squeeze(-1)


def dataset(n: int, d_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression problem: sample ``i`` is the same whatever ``n``, rank or attempt.

    Samples come in blocks of 1024, each from its own seeded generator, so asking for more
    samples never changes the earlier ones.
    """
    w = torch.randn(d_in, generator=torch.Generator().manual_seed(DATA_SEED))
    xs, ys = [], []
    for block in range((n + 1023) // 1024):
        gen = torch.Generator().manual_seed(DATA_SEED + 1 + block)
        x = torch.randn(1024, d_in, generator=gen)
        xs.append(x)
        ys.append(torch.sin(x @ w) + 0.1 * torch.randn(1024, generator=gen))
    return torch.cat(xs)[:n], torch.cat(ys)[:n]


def recompute_wanted(ds_config: dict[str, Any]) -> bool:
    """Recompute when the JSON's ``activation_checkpointing`` asks for any checkpoints."""
    if os.environ.get("DSSUP_RECOMPUTE", "none") in ("selective", "full"):
        return True
    section = ds_config.get("activation_checkpointing") or {}
    return bool(section.get("number_checkpoints") or section.get("partition_activations"))


def engine_report(engine: Any, model: TinyNet) -> dict[str, Any]:
    """What the engine itself says it runs with (not what we asked for)."""
    zc = engine.zero_optimization_stage() and engine._config.zero_config
    off_opt = getattr(getattr(zc, "offload_optimizer", None), "device", None) if zc else None
    off_par = getattr(getattr(zc, "offload_param", None), "device", None) if zc else None
    ac = engine._config.activation_checkpointing_config
    return {
        "zero_stage": int(engine.zero_optimization_stage()),
        "offload_optimizer": str(getattr(off_opt, "value", off_opt) or "none"),
        "offload_param": str(getattr(off_par, "value", off_par) or "none"),
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "grad_accum": engine.gradient_accumulation_steps(),
        "train_batch_size": engine.train_batch_size(),
        "dp": engine.dp_world_size,
        "bf16": bool(engine.bfloat16_enabled()),
        "fp16": bool(engine.fp16_enabled()),
        "load_universal": bool(engine.load_universal_checkpoint()),
        "activation_checkpointing": {
            "partition_activations": bool(ac.partition_activations),
            "number_checkpoints": ac.number_checkpoints,
            "cpu_checkpointing": bool(ac.cpu_checkpointing),
        },
        "recompute": model.recompute,
        "optimizer": type(engine.optimizer).__name__,
    }


def full_state(engine: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Every parameter's fp32 weight and Adam moments, whole, whatever the ZeRO stage.

    Collective under ZeRO-3 (every rank must call it). Stage 0 has no fragment mapping, so
    the state is read from the torch optimizer directly.
    """
    basic = engine.optimizer if engine.zero_optimization_stage() == 0 else None
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:  # ZeRO-1/2 map moments to parameters lazily (after a step)
        link()
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in engine.module.named_parameters():
        entry: dict[str, torch.Tensor] = {}
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            if basic is not None:
                value = p.detach() if key == "fp32" else basic.state.get(p, {}).get(key)
            elif key == "fp32":
                value = safe_get_full_fp32_param(p)
            else:
                value = safe_get_full_optimizer_state(p, key)
            if value is not None:
                entry[key] = value.detach().float().cpu().clone()
        out[name] = entry
    return out


def batch_for(step: int, micro: int, args_ns: Any, engine: Any, data: Any) -> Any:
    """Rank r's micro-batch ``micro`` of optimizer step ``step`` (0-based)."""
    mb, dp = engine.train_micro_batch_size_per_gpu(), engine.dp_world_size
    start = step * engine.train_batch_size() + (micro * dp + dist.get_rank()) * mb
    x, y = data
    x = x[start : start + mb]
    tokens = tokens_at(args_ns, step)
    if tokens > 1:  # each sample as a sequence: activations grow with the token count
        x = x[:, None, :] * (1 + torch.arange(tokens) / tokens)[None, :, None]
    dev = engine.device
    return x.to(dev), y[start : start + mb].to(dev)


def tokens_at(args: Any, step: int) -> int:
    """Tokens per sample at optimizer step ``step`` (0-based): longer from ``--long-from-step``,
    the usual way a job that started fine runs out of memory later."""
    if args.long_tokens and step >= args.long_from_step:
        return int(args.long_tokens)
    return int(args.tokens)


def train_step(engine: Any, step: int, args: Any, data: Any) -> float:
    """One optimizer step; returns the global batch's mean loss (identical on every rank)."""
    total = torch.zeros((), dtype=torch.float64)
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    for micro in range(engine.gradient_accumulation_steps()):
        x, y = batch_for(step, micro, args, engine, data)
        pred = engine(x.to(dtype)).float()
        pred = pred.mean(-1) if pred.dim() == 2 else pred  # mean over tokens
        loss = torch.nn.functional.mse_loss(pred, y)
        engine.backward(loss)
        engine.step()
        total += loss.detach().double().cpu()
    dist.all_reduce(total)
    return float(total) / (engine.gradient_accumulation_steps() * engine.dp_world_size)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deepspeed_config", "--deepspeed", dest="ds_config", required=True)
    ap.add_argument("--steps", type=int, default=8, help="total optimizer steps to reach")
    ap.add_argument("--save-dir", type=Path, default=None)
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--resume-from", type=Path, default=None, help="default: $DSSUP_RESUME_FROM")
    ap.add_argument("--d-in", type=int, default=16)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--tokens", type=int, default=1, help="tokens per sample")
    ap.add_argument("--long-tokens", type=int, default=0, help="tokens from --long-from-step")
    ap.add_argument("--long-from-step", type=int, default=0, help="0-based optimizer step")
    ap.add_argument("--mem-cap-mb", type=int, default=0, help="address-space budget after init")
    ap.add_argument(
        "--mem-cap-from-step", type=int, default=0, help="apply the cap before this 0-based step"
    )
    ap.add_argument("--fused-adam", action="store_true", help="torch AdamW(fused=True)")
    ap.add_argument("--state-digest", action="store_true", help="emit a state digest on load/save")
    ap.add_argument("--dump-after-load", type=Path, default=None, help="torch.save full state")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=0, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[Any, TinyNet, dict[str, Any]]:
    ds_config = json.loads(Path(args.ds_config).read_text())
    torch.manual_seed(MODEL_SEED)
    model = TinyNet(args.d_in, args.width, args.depth)
    model.recompute = recompute_wanted(ds_config)
    if weights := os.environ.get("DSSUP_FP32_WEIGHTS"):  # dssup's last-resort fallback
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    fused = {"fused": True} if args.fused_adam else {}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, **fused)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
    return engine, model, ds_config


def _load(engine: Any, src: Path) -> Any:
    """``src`` is a save dir (with ``latest``/``latest_universal``) or one tag directory."""
    if (src / "latest").is_file() or (src / "latest_universal").is_file():
        return engine.load_checkpoint(str(src))
    return engine.load_checkpoint(str(src.parent), tag=src.name)


def resume(engine: Any, args: argparse.Namespace) -> None:
    """Resume from ``--resume-from`` / ``$DSSUP_RESUME_FROM``, or keep the data position of
    dssup's fp32 fallback (fresh optimizer: weights only, set in ``build``)."""
    if weights := os.environ.get("DSSUP_FP32_WEIGHTS"):
        engine.global_steps = int(os.environ.get("DSSUP_RESUME_GLOBAL_STEPS", "0"))
        engine.global_samples = int(os.environ.get("DSSUP_RESUME_GLOBAL_SAMPLES", "0"))
        emit(
            "loaded",
            path=weights,
            global_steps=engine.global_steps,
            global_samples=engine.global_samples,
            universal=False,
            fp32_only=True,
        )
        return
    raw = os.environ.get("DSSUP_RESUME_FROM", "")
    src = args.resume_from or (Path(raw) if raw else None)
    if src is None:
        return
    t0 = time.monotonic()
    path, _client = _load(engine, src)
    if path is None:
        raise FileNotFoundError(f"no DeepSpeed checkpoint to resume from in {src}")
    emit(
        "loaded",
        path=str(path),
        global_steps=engine.global_steps,
        global_samples=engine.global_samples,
        universal=bool(engine.load_universal_checkpoint()),
        seconds=round(time.monotonic() - t0, 3),
    )


@record
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # The CPU accelerator JIT-compiles a shared-memory comm op on first use (35-80 s); gloo
    # does not need it.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    engine, model, _ = build(args)
    emit("engine", **engine_report(engine, model))
    resume(engine, args)
    report_started(  # the job-side report: what the engine really runs with, after the resume
        micro_batch=engine.train_micro_batch_size_per_gpu(),
        grad_accum=engine.gradient_accumulation_steps(),
        dp=engine.dp_world_size,
        global_batch=engine.train_batch_size(),
        first_step=int(engine.global_steps),
        recompute="full" if model.recompute else "none",
        framework="deepspeed",
    )
    if args.dump_after_load is not None:
        state = full_state(engine)
        if dist.get_rank() == 0:
            torch.save({"state": state, "global_steps": engine.global_steps}, args.dump_after_load)
    if args.state_digest and engine.global_steps:
        emit("state", global_steps=engine.global_steps, digest=state_digest(engine))
    data = dataset(args.steps * engine.train_batch_size(), args.d_in)
    vm_init_peak = vm_bytes("VmPeak")
    cap = MemoryCapAt(args.mem_cap_mb, args.mem_cap_from_step)
    while engine.global_steps < args.steps:
        step = engine.global_steps
        if cap.before_step(step):
            emit("capped", step=step, vm_base=cap.base, limit=cap.limit)
        loss = train_step(engine, step, args, data)
        emit("step", step=engine.global_steps, loss=loss, global_samples=engine.global_samples)
        if args.save_dir and args.save_every and engine.global_steps % args.save_every == 0:
            engine.save_checkpoint(str(args.save_dir), tag=f"global_step{engine.global_steps}")
            emit("saved", tag=f"global_step{engine.global_steps}", dir=str(args.save_dir))
            if dist.get_rank() == 0:
                report_checkpoint(engine.global_steps, args.save_dir)
            if args.state_digest and not cap.active:
                emit("state", global_steps=engine.global_steps, digest=state_digest(engine))
    emit(
        "memory",
        vm_base=cap.base,
        vm_init_peak=vm_init_peak,
        vm_peak=vm_bytes("VmPeak"),
        rss_peak=vm_bytes("VmHWM"),
    )
    report_completed(int(engine.global_steps))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
