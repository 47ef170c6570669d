"""``dssup calibrate --hf/--module``: trace the user's own blocks and fit a ``TracedProfile``.

Under one ``FakeTensorMode`` (nothing allocated, any size) the whole model is built once and its
repeated blocks are found and told apart (``blocks.find_stack``). The stack is then cut to a
reduced model of two blocks of each kind in model order -- a copy when the model has only one of
a kind -- and one training step is traced per (micro-batch, sequence length) of a grid: the same
three or more micro-batches at each of three sequence lengths, for each recompute level, plus one
check trace at a fourth sequence length the fit never saw. ``fit`` turns the windows into the
profile's terms; the profile then replays every trace it was fitted from, and the check trace,
and is refused (``FitError``, with the traces that disagree) if any forward or backward peak
misses by more than 0.1 %.
"""

from __future__ import annotations

import copy
import platform
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from dssup.errors import ConfigError
from dssup.memory.traced import (
    LevelTrace,
    Provenance,
    TracedProfile,
)
from dssup.runtime.traced.blocks import Stack
from dssup.runtime.traced.build import Job, build, checkpoint_blocks, versions
from dssup.runtime.traced.knobs import HFSource, Knobs, ModuleSource, TracedRun
from dssup.runtime.traced.levels import level_trace, point, self_check
from dssup.runtime.traced.step import TracedMeasurement, run_steps

__all__ = ["CalibrationRequest", "calibrate"]


class CalibrationRequest(BaseModel):
    """What to trace: the model, the step's knobs, the grid."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: HFSource | ModuleSource = Field(discriminator="kind", description="the model code")
    knobs: Knobs = Field(description="dtype, attention, optimizer (batch and length: the grid)")
    levels: tuple[Literal["none", "full"], ...] = Field(
        ("none", "full"), description="recompute levels traced (full: every block checkpointed)"
    )
    micro_batches: tuple[int, ...] = Field(
        (1, 2, 3), min_length=3, description="micro-batches of every line"
    )
    seq_lens: tuple[int, int, int] = Field(description="sequence lengths of the fit")
    check_seq_len: int = Field(ge=2, description="sequence length of the check trace")


def _like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)


def _copy(block: nn.Module) -> nn.Module:
    """A second block like ``block`` with its own (fake) parameters and buffers, made in the
    active tensor mode (the structure is deep-copied with its tensors held aside: a deep copy
    of a fake tensor would carry it into a mode of its own)."""
    held: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    for mod in block.modules():
        tables: tuple[dict[str, Any], ...] = (mod._parameters, mod._buffers)
        for table in tables:
            for name, t in table.items():
                if t is not None:
                    held.append((table, name, t))
                    table[name] = None
    try:
        twin = copy.deepcopy(block)
    finally:
        for table, name, t in held:
            table[name] = t
    index = {id(m): m2 for m, m2 in zip(block.modules(), twin.modules(), strict=True)}
    for mod in block.modules():
        other = index[id(mod)]
        for name, p in mod._parameters.items():
            if p is not None:
                other._parameters[name] = nn.Parameter(_like(p), p.requires_grad)
        for name, buf in mod._buffers.items():
            if buf is not None:
                other._buffers[name] = _like(buf)
    return twin


def _reduced(model: nn.Module, stack: Stack) -> tuple[list[nn.Module], list[str]]:
    """Two blocks of each kind, in model order (a copy when the model has one of a kind)."""
    blocks: list[nn.Module] = []
    kinds: list[str] = []
    for kind in dict.fromkeys(stack.kinds):
        found = [b for b, k in zip(stack.blocks, stack.kinds, strict=True) if k == kind][:2]
        if len(found) == 1:
            found.append(_copy(found[0]))
        blocks += found
        kinds += [kind, kind]
    parent_path, _, name = stack.path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, nn.ModuleList(blocks))
    config = getattr(model, "config", None)  # transformers runs layers[:num_hidden_layers]
    if config is not None and isinstance(getattr(config, "num_hidden_layers", None), int):
        config.num_hidden_layers = len(blocks)
    return blocks, kinds


@contextmanager
def _level(job: Job, source: HFSource | ModuleSource, level: str) -> Iterator[None]:
    """Checkpoint every block for ``full`` (transformers: its own switch)."""
    if level != "full":
        yield
        return
    if isinstance(source, HFSource):
        job.model.activation_checkpointing_enable({"use_reentrant": False})  # type: ignore[operator]
        try:
            yield
        finally:
            job.model.activation_checkpointing_disable()  # type: ignore[operator]
        return
    with checkpoint_blocks(job.stack.blocks):
        yield


def _trace(run: TracedRun, job: Job, b: int, s: int, log: bool = False) -> TracedMeasurement:
    knobs = run.knobs.model_copy(update={"micro_batch": b, "seq_len": s, "steps": 1})
    return run_steps(
        run.model_copy(update={"knobs": knobs}), job, "fake", log_tensors=log, timelines=True
    )


def _routed_share(m: TracedMeasurement, stored: dict[str, int]) -> float:
    total = sum(stored.values())
    routed = sum(v for k, v in stored.items() if ".experts" in k)
    return routed / total if total else 0.0


def calibrate(req: CalibrationRequest) -> TracedProfile:
    """Trace, fit and self-check the profile of ``req`` (see the module docstring)."""
    start = time.perf_counter()
    if req.check_seq_len in req.seq_lens or len(set(req.seq_lens)) != 3:
        raise ConfigError(
            "--trace-seq-lens", "needs three different lengths and a fourth for the check", ""
        )
    base = TracedRun(source=req.source, knobs=req.knobs.model_copy(update={"checkpointing": False}))
    with FakeTensorMode(allow_non_fake_inputs=False):
        job = build(base)
        full = job.stack
        total_params = sum(p.numel() for p in job.model.parameters())
        block_params = {
            k: sum(p.numel() for p in b.parameters())
            for b, k in zip(full.blocks, full.kinds, strict=True)
        }
        stage_params = total_params - sum(
            sum(p.numel() for p in b.parameters()) for b in full.blocks
        )
        blocks, kinds = _reduced(job.model, full)
        job.stack = Stack(full.path, blocks, kinds, full.mtp, list(range(len(blocks))))
        levels: dict[str, LevelTrace] = {}
        traces: dict[str, list[TracedMeasurement]] = {}
        t_opt, breakdown, routed, count = 0.0, [], 0.0, 0
        kernels: dict[str, int] = {}
        for level in req.levels:
            with _level(job, req.source, level):
                grid = [(b, s) for s in req.seq_lens for b in req.micro_batches]
                if level == req.levels[0]:  # the first step runs a few operators once: warm up
                    _trace(base, job, min(req.micro_batches), min(req.seq_lens))
                    count += 1
                ms = []
                for b, s in grid:
                    log = level == req.levels[0] and (b, s) == grid[-1]
                    m = _trace(base, job, b, s, log)
                    if log:
                        breakdown = m.top_tensors_fb
                        routed = _routed_share(m, m.stored_by_module)
                    ms.append(m)
                    for why in m.kernels_used:
                        kernels[why] = kernels.get(why, 0) + 1
                check = _trace(base, job, req.micro_batches[1], req.check_seq_len)
                count += len(ms) + 1
            levels[level] = level_trace([point(m) for m in ms], kinds, block_params, routed)
            traces[level] = [*ms, check]
            for m in ms:
                w = m.windows["opt"]
                t_opt = max(t_opt, (w["peak"]["Total"] - w["end"]["Total"]) / m.parameters)
    profile = TracedProfile(
        provenance=Provenance(
            source=req.source.kind,
            model=req.source.path if isinstance(req.source, HFSource) else req.source.target,
            model_type=str(req.source.config.get("model_type"))
            if isinstance(req.source, HFSource)
            else None,
            versions={**versions(), "python": platform.python_version()},
            knobs={
                "dtype": req.knobs.dtype,
                "attention": req.knobs.attention,
                "optimizer": req.knobs.optimizer,
                "recompute": ",".join(req.levels),
                "kernels": req.knobs.kernels,
                **({"attention_kernels": "; ".join(kernels)} if kernels else {}),
            },
            micro_batches=req.micro_batches,
            seq_lens=req.seq_lens,
            check_seq_len=req.check_seq_len,
            traces=count,
            seconds=0.0,
            created=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        ),
        dtype=req.knobs.dtype,
        optimizer=req.knobs.optimizer,
        attention=req.knobs.attention,
        levels=levels,
        optimizer_transient_per_param=t_opt,
        blocks=full.counts(),
        first_dense=full.first_dense(),
        found=full.describe(),
        mtp_modules=full.mtp,
        stage_parameters=stage_params,
        breakdown=breakdown,
        worst_check=0.0,
    )
    worst = max(self_check(profile, lv, kinds, traces[lv]) for lv in req.levels)
    seconds = round(time.perf_counter() - start, 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    prov = profile.provenance.model_copy(update={"seconds": seconds, "peak_rss_bytes": rss})
    return profile.model_copy(update={"worst_check": worst, "provenance": prov})
