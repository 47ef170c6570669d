"""Run the training steps of a ``Job`` under the phase tracker: real (allocating) or fake.

A real run is cross-checked against ``torch.profiler`` memory events (an independent source).
They must agree within 4 KiB (or 0.01 %) plus, with checkpointing, the CPU RNG states that
``torch.utils.checkpoint`` stashes per checkpointed block (``torch.get_rng_state()``, created
outside the dispatcher: the profiler sees them, MemTracker cannot); else ``MeasurementMismatch``.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch._subclasses.fake_tensor import FakeTensorMode

from dssup.errors import ConfigError
from dssup.runtime.reference.crosscheck import live_bytes, profiler_peak
from dssup.runtime.traced.build import Job, build, loss_of, versions
from dssup.runtime.traced.cudasdpa import cuda_sdpa
from dssup.runtime.traced.fakefix import cpu_fake_fixes
from dssup.runtime.traced.knobs import Knobs, TracedRun
from dssup.runtime.tracker import (
    DEVICE,
    TOLERANCE_BYTES,
    MeasurementMismatch,
    Phase,
    PhaseTracker,
    plain,
)

__all__ = ["TracedMeasurement", "measure", "run_steps"]

Mode = Literal["real", "fake"]


class TracedMeasurement(BaseModel):
    """The allocator peak of the steps of one ``TracedRun`` and where it happened."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run: TracedRun
    mode: Mode = Field(description="real CPU tensors or a FakeTensorMode trace")
    peak_bytes: int = Field(description="allocator peak over all steps (MemTracker), bytes")
    phase: Phase = Field(description="phase of the step that holds the peak")
    step: int = Field(description="1-based step that holds the peak")
    breakdown: dict[str, int] = Field(description="bytes by MemTracker category at the peak")
    profiler_peak_bytes: int | None = Field(
        None, description="independent peak from torch.profiler memory events (real runs), bytes"
    )
    profiler_allowance_bytes: int = Field(
        0, description="bytes the two sources may differ by (RNG states, scalars)"
    )
    seconds: float = Field(description="wall time of the measured steps, s")
    phase_peaks: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="'step:phase' -> breakdown at that phase's own peak"
    )
    tail_peaks: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="'step' -> breakdown at the peak of the end of backward (after the first "
        "block's output gradient is complete)",
    )
    parameters: int = Field(description="parameters of the (possibly reduced) model")
    parameter_tensors: int = Field(description="parameter tensors (AdamW keeps a step each)")
    blocks: dict[str, int] = Field(description="repeated blocks per kind in the model run")
    found: str = Field(description="what the block discovery found, in words")
    versions: dict[str, str] = Field(description="torch / transformers versions")
    windows: dict[str, dict[str, dict[str, int]]] = Field(
        default_factory=dict,
        description="last step's windows (fwd:pre, fwd:block:i, fwd:after:i, bwd:head, "
        "bwd:block:i, bwd:embed, opt) -> categories at their start, peak and end",
    )
    timelines: dict[str, list[tuple[int, int, str]]] = Field(
        default_factory=dict,
        description="calibration traces: per window, (bytes, gradient bytes) over its start "
        "after every operator, and the operator",
    )
    top_tensors_fb: list[tuple[str, int, int]] = Field(
        default_factory=list, description="the same at the forward/backward peak"
    )
    stored_by_module: dict[str, int] = Field(
        default_factory=dict,
        description="bytes the blocks keep from their forward to their backward, by the module "
        "that made them (logged traces)",
    )
    kernels_used: dict[str, int] = Field(
        default_factory=dict,
        description="attention kernels a cuda-kernel trace took, with why, and how often",
    )
    top_tensors: list[tuple[str, int, int]] = Field(
        default_factory=list,
        description="largest groups alive at the peak: ('op @ module (phase)', count, bytes)",
    )


def _optimizer(knobs: Knobs, job: Job) -> torch.optim.Optimizer:
    kind = {"foreach": {"foreach": True}, "fused": {"fused": True}, "forloop": {"foreach": False}}
    return torch.optim.AdamW(job.model.parameters(), lr=1e-4, **kind[knobs.optimizer])  # type: ignore[arg-type]


def _loop(job: Job, knobs: Knobs, opt: torch.optim.Optimizer, batch: Any, mt: PhaseTracker) -> None:
    for i in range(1, knobs.steps + 1):
        mt.step = i
        mt.reset_mod_stats()
        opt.zero_grad(set_to_none=True)
        mt.phase, mt.in_tail = "forward", False
        mt.mark("fwd:pre")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=knobs.dtype == "amp"):
            loss = loss_of(job.call(job.model, batch))
            mt.mark("fwd:exit")  # leaving autocast frees its cached weight casts
        mt.phase = "backward"
        mt.mark("bwd:head")
        loss.backward()  # type: ignore[no-untyped-call]
        del loss
        mt.phase, mt.in_tail = "optimizer", False
        mt.mark("opt")
        opt.step()
        mt.mark("done")


def _allowance(knobs: Knobs, job: Job, peak: int) -> int:
    rng = torch.get_rng_state().numel() if knobs.checkpointing else 0
    return max(TOLERANCE_BYTES, peak // 10_000) + rng * (len(job.stack.blocks) + 2)


def _stored(mt: PhaseTracker) -> dict[str, int]:
    out: dict[str, int] = {}
    for label in mt.windows:
        if label.startswith("fwd:block:"):
            for where, size in mt.kept_from(label).items():
                out[where] = out.get(where, 0) + size
    return out


def _agree(diff: int, peak: int, allowance: int) -> bool:
    """Profiler minus MemTracker: within the plain tolerance, or the RNG-state allowance."""
    return abs(diff) <= max(TOLERANCE_BYTES, peak // 10_000) or 0 <= diff <= allowance


def run_steps(
    run: TracedRun, job: Job, mode: Mode, log_tensors: bool = False, timelines: bool = False
) -> TracedMeasurement:
    """Train ``job`` (built for ``run``, in the active tensor mode) for ``run.knobs.steps``
    steps under the tracker; a real run is cross-checked against the profiler."""
    knobs = run.knobs
    if mode == "real":  # garbage freed during the run would lower the profiler's count only
        gc.collect()
    for p in job.model.parameters():
        p.grad = None
    opt = _optimizer(knobs, job)
    if mode == "real":
        torch.manual_seed(knobs.seed + 1)
    batch = job.make_batch(knobs.micro_batch, knobs.seq_len)
    mt = PhaseTracker(log_tensors=log_tensors, per_module=mode == "real", timelines=timelines)
    mt.watch_tail(job.stack.blocks[0])
    mt.watch_blocks(job.stack.blocks)
    mt.name_modules(job.model)
    mt.track_external(job.model, opt, *[t for t in batch.values() if isinstance(t, torch.Tensor)])
    fixes = cpu_fake_fixes() if mode == "fake" else contextlib.nullcontext()
    if knobs.kernels == "cuda" and mode != "fake":
        raise ConfigError(
            "--kernels", "CUDA's kernels can only be traced, not run on this CPU", "use --mode fake"
        )
    start = time.perf_counter()
    used: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        if knobs.kernels == "cuda":
            used = stack.enter_context(cuda_sdpa()).used
        prof = None
        if mode == "real":
            base = live_bytes(job.model, opt, *batch.values())
            prof = stack.enter_context(profiler_peak())
        try:
            with mt, fixes:
                _loop(job, knobs, opt, batch, mt)
        finally:
            mt.close()
    seconds = time.perf_counter() - start
    if timelines:  # what leaving autocast freed, by the window that made it (``levels.py``)
        for label, size in mt.freed_in("fwd:exit").items():
            mt.windows[label]["released"] = {"Total": size}
    dev = mt.get_tracker_snapshot("peak")[DEVICE]
    peak = dev["Total"]
    prof_peak = None if prof is None else base + prof.peak()
    allowance = _allowance(knobs, job, peak)
    if prof_peak is not None and not _agree(prof_peak - peak, peak, allowance):
        raise MeasurementMismatch(
            f"MemTracker peak {peak} B but torch.profiler says {prof_peak} B "
            f"(allowed: 0..{allowance} B more)"
        )
    params = list(job.model.parameters())
    return TracedMeasurement(
        run=run,
        mode=mode,
        peak_bytes=peak,
        phase=mt.peak_at[0],
        step=mt.peak_at[1],
        breakdown={k: v for k, v in plain(dev).items() if v},
        profiler_peak_bytes=prof_peak,
        profiler_allowance_bytes=allowance,
        seconds=seconds,
        phase_peaks=mt.phase_peaks,
        tail_peaks=mt.tail_peaks,
        parameters=sum(p.numel() for p in params),
        parameter_tensors=len(params),
        blocks=job.stack.counts(),
        found=job.stack.describe(),
        versions=versions(),
        windows=mt.windows,
        timelines=mt.timelines or {},
        top_tensors=mt.alive_at_peak() if log_tensors else [],
        kernels_used=dict(used),
        top_tensors_fb=mt.alive_at_peak(fb=True) if log_tensors else [],
        stored_by_module=_stored(mt) if log_tensors else {},
    )


def measure(run: TracedRun, mode: Mode = "real", log_tensors: bool = False) -> TracedMeasurement:
    """Build the model of ``run`` (fake: inside FakeTensorMode) and measure its steps."""
    if mode == "real":
        torch.manual_seed(run.knobs.seed)
        return run_steps(run, build(run), mode, log_tensors)
    with FakeTensorMode(allow_non_fake_inputs=False):
        return run_steps(run, build(run), mode, log_tensors)
