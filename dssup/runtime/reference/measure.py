"""Measured truth: the allocator peak of real reference training steps, and where it happens.

``measure`` runs ``RunSpec.steps`` AdamW steps of the reference model under PyTorch's
``MemTracker`` either for real on CPU (small shapes) or under ``FakeTensorMode`` (full shapes,
nothing allocated). It records the peak bytes, the breakdown at the peak (parameters, gradients,
optimizer state, activations, temporaries) and the phase holding it (forward, backward,
optimizer step). A real run is cross-checked against an independent source, ``torch.profiler``
memory events, and a disagreement raises ``MeasurementMismatch`` instead of being reported.

It also records each step's *end of backward*: the peak from the moment the first block's
output gradient is complete (its backward, and the embedding's, are all that is left) to the
optimizer step. That window holds nearly all gradients; with the optimizer off the device it
can hold the step's peak, and ``dssup calibrate`` fits the eager profile's term for it.
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from collections.abc import Iterator
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch._subclasses.fake_tensor import FakeTensorMode

from dssup.errors import DssupError
from dssup.runtime.reference.config import RunSpec
from dssup.runtime.reference.crosscheck import live_bytes, profiler_peak
from dssup.runtime.reference.model import ReferenceModel, build_model
from dssup.runtime.reference.zero import ShardedAdamW, fake_world
from dssup.runtime.tracker import (
    DEVICE,
    TOLERANCE_BYTES,
    MeasurementMismatch,
    Phase,
    PhaseTracker,
)

__all__ = ["Measurement", "MeasurementMismatch", "measure"]


class Measurement(BaseModel):
    """One measured configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run: RunSpec
    mode: Literal["real", "fake"] = Field(description="real CPU tensors or FakeTensorMode")
    peak_bytes: int = Field(description="allocator peak over all steps (MemTracker)")
    phase: Phase = Field(description="phase of the step that holds the peak")
    step: int = Field(description="1-based step that holds the peak")
    breakdown: dict[str, int] = Field(description="bytes by MemTracker category at the peak")
    profiler_peak_bytes: int | None = Field(
        None, description="independent peak from torch.profiler memory events (real runs)"
    )
    seconds: float = Field(description="wall time of the measured steps")
    phase_peaks: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="'step:phase' -> breakdown at that phase's own peak"
    )
    tail_peaks: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="'step' -> breakdown at the peak of the end of backward (first block's "
        "backward and the embedding's)",
    )


Optimizer = torch.optim.Optimizer | ShardedAdamW


def _optimizer(run: RunSpec, model: ReferenceModel) -> Optimizer:
    kind = {"foreach": {"foreach": True}, "fused": {"fused": True}, "forloop": {"foreach": False}}
    if run.distributed:
        return ShardedAdamW(model, run.zero_stage, run.offload_optimizer, kind[run.optimizer])
    return torch.optim.AdamW(model.parameters(), lr=1e-4, **kind[run.optimizer])  # type: ignore[arg-type]


def _inner(opt: Optimizer) -> torch.optim.Optimizer:
    return opt.inner if isinstance(opt, ShardedAdamW) else opt


def _steps(
    run: RunSpec,
    model: ReferenceModel,
    opt: Optimizer,
    tokens: torch.Tensor,
    mt: PhaseTracker,
) -> None:
    for i in range(1, run.steps + 1):
        mt.step = i
        mt.reset_mod_stats()
        opt.zero_grad(set_to_none=True)
        mt.phase, mt.in_tail = "forward", False
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run.dtype == "amp"):
            loss = model(tokens)
        mt.phase = "backward"
        with warnings.catch_warnings():
            # A ZeRO-2 hook frees each gradient once reduced; MemTracker's own post-accumulate
            # hook then finds None and warns. The gradient was already counted by its pre-hook.
            warnings.filterwarnings("ignore", "Expected a tensor", UserWarning)
            loss.backward()
        del loss
        mt.phase, mt.in_tail = "optimizer", False
        opt.step()


@contextlib.contextmanager
def _maybe_fake(fake: bool) -> Iterator[None]:
    if not fake:
        yield
        return
    with FakeTensorMode(allow_non_fake_inputs=False):
        yield


def _tokens(run: RunSpec) -> torch.Tensor:
    g = torch.Generator().manual_seed(run.seed + 1)
    return torch.randint(0, run.model.vocab, (run.micro_batch, run.seq_len), generator=g)


def measure(
    run: RunSpec, mode: Literal["real", "fake"] = "real", cross_check: bool = True
) -> Measurement:
    """Peak, breakdown and phase of ``run.steps`` training steps (see the module docstring)."""
    if mode == "fake" and run.moe_routing == "dropless" and run.model.moe is not None:
        raise DssupError("dropless MoE has data-dependent shapes: measure it in real mode")
    # Garbage of an earlier run freed during this one would lower the profiler's running total
    # (it knows those blocks) without MemTracker ever having seen them: collect it first.
    gc.collect()
    world = fake_world(run.dp) if run.dp > 1 else contextlib.nullcontext()
    with world, _maybe_fake(mode == "fake"):
        model = build_model(run)
        opt = _optimizer(run, model)
        tokens = (
            _tokens(run)
            if mode == "real"
            else torch.randint(0, run.model.vocab, (run.micro_batch, run.seq_len))
        )
        mt = PhaseTracker()
        mt.watch_tail(model.layers[0])
        mt.track_external(model, _inner(opt), tokens)
        start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            prof = None
            if mode == "real" and cross_check:
                base = live_bytes(model, _inner(opt), tokens)
                prof = stack.enter_context(profiler_peak())
            with mt:
                _steps(run, model, opt, tokens, mt)
        seconds = time.perf_counter() - start
    snap = mt.get_tracker_snapshot("peak")
    dev = snap[DEVICE]
    peak = dev["Total"]
    breakdown = {str(k.value if hasattr(k, "value") else k): v for k, v in dev.items() if v}
    prof_peak = None if prof is None else base + prof.peak()
    if prof_peak is not None and abs(prof_peak - peak) > max(TOLERANCE_BYTES, peak // 10_000):
        raise MeasurementMismatch(
            f"MemTracker peak {peak} B but torch.profiler says {prof_peak} B for {run.model.name}"
        )
    phase, step = mt.peak_at
    return Measurement(
        run=run,
        mode=mode,
        peak_bytes=peak,
        phase=phase,
        step=step,
        breakdown=breakdown,
        profiler_peak_bytes=prof_peak,
        seconds=seconds,
        phase_peaks=mt.phase_peaks,
        tail_peaks=mt.tail_peaks,
    )
