"""The hand-off plan: how every knob of dssup's plan reaches this script, worked out before
attempt 1, printed, journalled, and used to choose remedies.

For each knob (micro-batch, accumulation, recompute, ZeRO stage, offload, the allocator
setting, loading to the CPU, and the resume) the script's framework says how it is received:
a flag already on the command line, a flag the framework always accepts, a launcher option,
an environment variable the source shows it reads, the DeepSpeed JSON dssup rewrites, or not
at all (with what to add). Then:

* a remedy that changes a knob the script cannot receive is not used, and the decision says
  why (``refusal``) — e.g. halving the micro-batch of a script that would never see the
  doubled accumulation, which would silently halve the global batch;
* two plans that reach the script identically (selective and full recompute both become
  ``--gradient_checkpointing``) are one config: the second is never launched (``fingerprint``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dssup.supervisor.frameworks import KNOBS, Channel, Framework, Job, detect, read_source
from dssup.supervisor.launchers.base import LaunchCommand
from dssup.supervisor.models import TrainingPlan

__all__ = ["HandOff", "build_handoff"]

_NAMES = {
    "micro_batch": "micro-batch",
    "grad_accum": "accumulation",
    "recompute": "recompute",
    "zero_stage": "ZeRO stage",
    "offload": "offload",
    "expandable_segments": "allocator setting",
    "load_to_cpu": "load to CPU",
    "resume": "resume",
}
_ALLOC = Channel(
    knob="expandable_segments", via="env", name="PYTORCH_CUDA_ALLOC_CONF",
    evidence="torch's CUDA allocator reads it at start-up",
)  # fmt: skip


class HandOff(BaseModel):
    """How the plan reaches the script (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    launcher: str = Field(description="torchrun, accelerate, deepspeed")
    world: str = Field(description="ranks, nodes and where that came from")
    framework: str = Field(description="hf-trainer, megatron, lightning-cli, accelerate, plain")
    evidence: str = Field(description="why dssup thinks the script is of that framework")
    script: str = Field(description="the script's file, or why its source is unknown")
    channels: dict[str, Channel] = Field(description="knob -> how it is received")
    checkpoint_dir: str | None = Field(None, description="where the job saves checkpoints")
    checkpoint_source: str = Field("", description="the flag or option that says so")
    warnings: tuple[str, ...] = Field((), description="what the user should know before attempt 1")

    def receives(self, knob: str) -> bool:
        ch = self.channels.get(knob)
        return ch is not None and ch.receives

    @property
    def capabilities(self) -> frozenset[str]:
        """Plan fields a remedy may change (knobs the script receives)."""
        return frozenset(k for k in KNOBS if k != "resume" and self.receives(k))

    def refusal(self, old: TrainingPlan, new: TrainingPlan) -> str | None:
        """Why ``new`` cannot be carried out for this script, or None."""
        reasons = []
        for knob, (before, after) in new.changes_from(old).items():
            ch = self.channels.get(knob)
            if knob not in _NAMES or ch is None or ch.receives:
                continue
            fix = f"; {ch.fix}" if ch.fix else ""
            reasons.append(
                f"{_NAMES[knob]} {before} -> {after} cannot reach the script: {ch.evidence}{fix}"
            )
        return "; ".join(reasons) or None

    def fingerprint(self, plan: TrainingPlan) -> tuple[tuple[str, str], ...]:
        """What the script receives of ``plan``: equal fingerprints are one run."""
        seen = [(k, self.channels[k].render(getattr(plan, k))) for k in KNOBS
                if k != "resume" and k in self.channels]  # fmt: skip
        return (*seen, ("global_batch", str(plan.global_batch)), ("dp", str(plan.dp)),
                ("extra", repr(sorted(plan.extra.items()))))  # fmt: skip

    def lines(self, plan: TrainingPlan) -> list[str]:
        out = [
            f"hand-off plan: {self.launcher}, {self.world}; framework {self.framework} "
            f"({self.evidence}); script {self.script}",
        ]
        for knob in ("micro_batch", "grad_accum", "recompute", "resume"):
            value = "" if knob == "resume" else f" {getattr(plan, knob)}"
            out.append(f"  {_NAMES[knob]}{value}: {self.channels[knob].line()}")
        zero = [k for k in ("zero_stage", "offload") if self.receives(k)]
        for knob in zero:
            out.append(f"  {_NAMES[knob]} {getattr(plan, knob)}: {self.channels[knob].line()}")
        if not zero:
            out.append("  ZeRO stage, offload: not received (no DeepSpeed config in the command)")
        alloc, cpu = self.channels["expandable_segments"], self.channels["load_to_cpu"]
        out.append(f"  allocator setting: {alloc.line()}")
        out.append(f"  load checkpoints to the CPU: {cpu.line()}")
        where = self.checkpoint_dir or "none found"
        source = f" (from {self.checkpoint_source})" if self.checkpoint_source else ""
        out.append(f"  checkpoints: {where}{source}")
        if plan.global_batch is not None and plan.micro_batch and plan.grad_accum:
            out.append(
                f"  global batch {plan.global_batch} = micro-batch {plan.micro_batch} x "
                f"accumulation {plan.grad_accum} x {plan.dp} data-parallel; dssup says it is "
                "kept only where the job's own report (or its framework's log) confirms it"
            )
        out += [f"  warning: {w}" for w in self.warnings]
        return out


def _adapter_channels(adapters: Sequence[Any], cmd: LaunchCommand) -> dict[str, Channel]:
    found: dict[str, Channel] = {}
    for adapter in adapters:
        method = getattr(adapter, "channels", None)
        if callable(method):
            found.update(method(cmd))
    return found


def build_handoff(
    cmd: LaunchCommand,
    adapters: Sequence[Any] = (),
    checkpoint_dir: Path | None = None,
    cwd: Path | None = None,
) -> tuple[HandOff, Job, Framework]:
    """Detect the framework, work out every channel, find where checkpoints go."""
    job = Job(cmd, read_source(cmd, cwd))
    framework, evidence = detect(job)
    channels = dict(framework.channels(job))
    channels["expandable_segments"] = _ALLOC
    for knob, ch in _adapter_channels(adapters, cmd).items():
        if knob in {"zero_stage", "offload"} or not channels.get(knob, ch).receives:
            channels[knob] = ch
    for knob in KNOBS:
        channels.setdefault(
            knob,
            Channel(knob=knob, via="none", evidence=f"{framework.name} scripts have no way for it"),
        )
    source, where = "--checkpoint-dir (dssup)", checkpoint_dir
    if where is None:
        found = framework.checkpoint_dir(job)
        for adapter in adapters:
            dirs = adapter.checkpoint_dirs(cmd)
            if found is None and dirs:
                found = (dirs[0], "the DeepSpeed save directory")
        where, source = found if found else (None, "")
    warnings = []
    if where is None:
        warnings.append("no checkpoint directory found in the command: every relaunch starts "
                        "from step 0; pass --checkpoint-dir DIR")  # fmt: skip
    elif not channels["resume"].receives:
        warnings.append(f"the script shows no way to resume ({channels['resume'].evidence}): "
                        "a relaunch may start from step 0")  # fmt: skip
    world = cmd.world()
    handoff = HandOff(
        launcher=cmd.name,
        world=f"{world.world_size} rank(s) ({world.nnodes} node(s) x {world.nproc_per_node}, "
        f"from {world.source})",
        framework=framework.name,
        evidence=evidence,
        script=str(job.source.path) if job.source.path else job.source.why,
        channels=channels,
        checkpoint_dir=str(where) if where is not None else None,
        checkpoint_source=source,
        warnings=tuple(warnings),
    )
    return handoff, job, framework
