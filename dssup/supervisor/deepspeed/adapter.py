"""The DeepSpeed ``PlanAdapter``: how the generic supervisor reads and steers a DeepSpeed job.

* ``initial_plan``: the batch triple, ZeRO stage, offload and recompute from the JSON named in
  the worker arguments (fields the supervisor already knows from its own flags win);
* ``remedy_steps``: the DeepSpeed rung (``ladder.DeepSpeedStep``), which scores its options
  with the parameter count of the job's latest checkpoint when no model is described;
* ``apply``: for each attempt, the user's JSON with the plan applied is written atomically to
  ``<attempt dir>/ds_config.json`` (plus ``ds_config.changes.json``, the diff with reasons),
  the worker's config flag is pointed at it, and the latest DeepSpeed checkpoint is made
  loadable under the new stage / DP size (``convert.prepare_resume``: direct, universal
  conversion cached under ``<run dir>/deepspeed-ucp``, or the loud fp32 fallback). The
  environment then names what to resume from (``DSSUP_RESUME_FROM``, a tag directory) and
  how (``DSSUP_DS_RESUME_KIND``; with the fallback, ``DSSUP_FP32_WEIGHTS``,
  ``DSSUP_RESUME_GLOBAL_STEPS`` and ``DSSUP_RESUME_GLOBAL_SAMPLES``, so the script keeps its
  data position);
* ``checkpoint_dirs``: the save directories the worker arguments name.

The user's JSON and checkpoints are only read. ``load_universal`` is set for one attempt only:
once that attempt has saved natively at the new stage, the next decision is a direct load.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dssup.jobreport import ReportRecord, Started
from dssup.supervisor.adapters import AppliedPlan, RemedyStep
from dssup.supervisor.command import LaunchCommand
from dssup.supervisor.deepspeed.assess import assess_attempt
from dssup.supervisor.deepspeed.ckpt_info import CheckpointInfo, find_latest_complete
from dssup.supervisor.deepspeed.config import (
    DeepSpeedPlan,
    Device,
    derive_plan,
    find_config,
    load_config_value,
)
from dssup.supervisor.deepspeed.convert import Resume, prepare_resume
from dssup.supervisor.deepspeed.ladder import DeepSpeedStep, MemoryContext
from dssup.supervisor.deepspeed.render import render_config, write_json_atomic
from dssup.supervisor.deepspeed.savings import ParamContext, param_context
from dssup.supervisor.frameworks.base import Channel
from dssup.supervisor.models import TrainingPlan

__all__ = ["SAVE_DIR_FLAGS", "DeepSpeedAdapter", "to_ds_plan"]

log = logging.getLogger(__name__)
SAVE_DIR_FLAGS = ("--save-dir", "--save_dir", "--save", "--output_dir", "--output-dir")
_OFFLOAD: dict[str, tuple[Device, Device]] = {
    "none": ("none", "none"),
    "optimizer": ("cpu", "none"),
    "optimizer+params": ("cpu", "cpu"),
}


def _flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    for i, tok in enumerate(args):
        name, sep, value = tok.partition("=")
        if name in names:
            if sep:
                return value
            if i + 1 < len(args):
                return args[i + 1]
    return None


def to_ds_plan(plan: TrainingPlan, user: DeepSpeedPlan, load_universal: bool) -> DeepSpeedPlan:
    """The supervisor's plan in DeepSpeed terms (precision and unknowns from the user's JSON)."""
    opt, par = _OFFLOAD.get(plan.offload, (user.offload_optimizer, user.offload_param))
    if plan.offload == "none" and (
        user.offload_optimizer != "none" or user.offload_param != "none"
    ):
        opt, par = user.offload_optimizer, user.offload_param  # the user's own offload stays
    return user.model_copy(
        update={
            "micro_batch": plan.micro_batch or user.micro_batch,
            "grad_accum": plan.grad_accum or user.grad_accum,
            "train_batch_size": plan.global_batch or user.train_batch_size,
            "dp": plan.dp,
            "zero_stage": plan.zero_stage,
            "offload_optimizer": opt,
            "offload_param": par,
            "activation_checkpointing": plan.recompute != "none" or user.activation_checkpointing,
            "load_universal": load_universal,
        }
    )


class DeepSpeedAdapter:
    """``PlanAdapter`` for jobs that pass a DeepSpeed JSON to their training script."""

    name = "deepspeed"
    CAPABILITIES = frozenset({"zero_stage", "offload", "recompute"})

    def __init__(self, memory: MemoryContext | None = None, python: str | None = None) -> None:
        self.memory = memory
        self.python = python
        self.last_resume: Resume | None = None
        self.command: LaunchCommand | None = None
        # Inert until initial_plan finds a DeepSpeed JSON: a plain DDP job must never be
        # offered a ZeRO stage (by this rung or by the memory-model rung via capabilities).
        self.active = False
        self.capabilities: frozenset[str] = frozenset()

    def applies(self, command: LaunchCommand) -> bool:
        """A DeepSpeed job: its worker arguments name a DeepSpeed config."""
        return find_config(command.script_args) is not None

    def _user_config(self, command: LaunchCommand) -> tuple[dict[str, Any], int] | None:
        src = find_config(command.script_args)
        if src is None:
            return None
        return load_config_value(src.value), command.world_size()

    def initial_plan(self, command: LaunchCommand, plan: TrainingPlan) -> TrainingPlan:
        found = self._user_config(command)
        if found is None:
            return plan
        raw, world = found
        user = derive_plan(raw, world, _auto(plan))
        self.active, self.capabilities, self.command = True, self.CAPABILITIES, command
        offload = {("none", "none"): "none", ("cpu", "none"): "optimizer"}.get(
            (user.offload_optimizer, user.offload_param), "optimizer+params"
        )
        return plan.model_copy(
            update={
                "micro_batch": plan.micro_batch or user.micro_batch,
                "grad_accum": plan.grad_accum or user.grad_accum,
                "global_batch": plan.global_batch or user.train_batch_size,
                "dp": world,
                "zero_stage": user.zero_stage,
                "offload": offload,
                "recompute": "full" if user.activation_checkpointing else plan.recompute,
            }
        )

    def channels(self, command: LaunchCommand) -> dict[str, Channel]:
        """How the JSON carries the plan (the hand-off): ZeRO, offload, recompute, and the
        batch where the script takes it from the JSON."""
        src = find_config(command.script_args)
        if src is None:
            return {}
        name = f"{src.flag} {src.value}"
        keys = {
            "zero_stage": "zero_optimization.stage",
            "offload": "zero_optimization.offload_*",
            "recompute": "activation_checkpointing",
            "micro_batch": "train_micro_batch_size_per_gpu",
            "grad_accum": "gradient_accumulation_steps",
        }
        return {
            knob: Channel(
                knob=knob,
                via="config",
                name=f"{key} in {name}",
                evidence="dssup writes a new JSON for each attempt",
                boolean=knob == "recompute",
            )
            for knob, key in keys.items()
        }

    def remedy_steps(self) -> Sequence[RemedyStep]:
        return [DeepSpeedStep(memory=self.memory, params=self.params)] if self.active else []

    def params(self) -> ParamContext | None:
        """Parameter count and precision from the latest complete checkpoint, if any."""
        return param_context(self.latest_checkpoint(self.command)) if self.command else None

    def checkpoint_dirs(self, command: LaunchCommand) -> list[Path]:
        if find_config(command.script_args) is None:
            return []
        value = _flag_value(command.script_args, SAVE_DIR_FLAGS)
        return [Path(value)] if value else []

    def latest_checkpoint(self, command: LaunchCommand) -> CheckpointInfo | None:
        for root in self.checkpoint_dirs(command):
            info = find_latest_complete(root) if root.is_dir() else None
            if info is not None:
                return info
        return None

    def apply(
        self,
        plan: TrainingPlan,
        command: LaunchCommand,
        script_args: list[str],
        attempt_dir: Path,
    ) -> AppliedPlan:
        src = find_config(script_args)
        found = self._user_config(command)
        if src is None or found is None:
            return AppliedPlan()
        raw, world = found
        user = derive_plan(raw, world, _auto(plan))
        resume = prepare_resume(
            self.latest_checkpoint(command),
            plan.zero_stage,
            plan.dp,
            attempt_dir.parent / "deepspeed-ucp",
            python=self.python or sys.executable,
        )
        self.last_resume = resume
        new, changes = render_config(raw, to_ds_plan(plan, user, resume.load_universal))
        path = write_json_atomic(attempt_dir / "ds_config.json", new)
        diff = [c.model_dump(mode="json") for c in changes]
        write_json_atomic(attempt_dir / "ds_config.changes.json", {"changes": diff})
        (attempt_dir / "ds_resume.json").write_text(resume.model_dump_json(indent=1))
        for change in changes:
            log.info("deepspeed config: %s", change.line())
        args = list(script_args)
        if src.inline:
            args[src.index] = f"{src.flag}={path}"
        else:
            args[src.index + 1] = str(path)
        notes = [f"wrote {path}"] + [c.line() for c in changes]
        notes.append(f"resume: {resume.kind} ({resume.reason})")
        if resume.warning:
            notes.append(resume.warning)
        return AppliedPlan(script_args=args, env=_resume_env(resume, path), notes=notes)

    def reported(self, text: str) -> list[ReportRecord]:
        """``started`` records from the engine's own "DeepSpeedEngine configuration" dump on
        rank 0 (``DeepSpeedConfig.print``: printed at INFO; DeepSpeed 0.19's logger defaults to
        WARNING, so only jobs that raise it show it)."""
        out: list[ReportRecord] = []
        for block in text.split("DeepSpeedEngine configuration:")[1:]:
            found = {k: int(v) for k, v in _DS_FIGURE.findall(block[:20_000])}
            mb, gas = (
                found.get("train_micro_batch_size_per_gpu"),
                found.get("gradient_accumulation_steps"),
            )
            gb, world = found.get("train_batch_size"), found.get("world_size")
            if mb and gas and gb and world:
                out.append(Started(rank=0, world_size=world, dp=world, micro_batch=mb, grad_accum=gas,
                                   global_batch=gb, framework="deepspeed",
                                   source="deepspeed-engine-log"))  # fmt: skip
        return out

    def assess(self, attempt_dir: Path) -> dict[str, Any] | None:
        """Loss continuity of an attempt that resumed (``assess_attempt``), once it has ended:
        the supervisor journals it, and a jump or a sample gap fails the recovery."""
        record = assess_attempt(attempt_dir)
        if record is None:
            return None
        level = logging.INFO if record.ok else logging.ERROR
        log.log(level, "loss continuity after resume (%s): %s", attempt_dir.name, record.detail)
        return record.model_dump(mode="json")


# DeepSpeedConfig.print: "  {arg} {'.' * (29 - len(arg))} {value}" (no dots past 29 characters)
_DS_FIGURE = re.compile(
    r"^.*?\b(train_batch_size|train_micro_batch_size_per_gpu|gradient_accumulation_steps|"
    r"world_size) \.*\s*(\d+)\s*$",
    re.MULTILINE,
)


def _auto(plan: TrainingPlan) -> dict[str, int | None]:
    """What HF's integration would fill "auto" batch keys with (see ``config.fill_auto``)."""
    return {"micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum}


def _resume_env(resume: Resume, config: Path) -> dict[str, str]:
    env = {"DSSUP_DS_CONFIG": str(config), "DSSUP_DS_RESUME_KIND": resume.kind}
    if resume.kind in ("direct", "universal") and resume.load_dir is not None:
        tag = resume.source.name if resume.source else ""
        target = resume.load_dir / tag if (resume.load_dir / tag).is_dir() else resume.load_dir
        env["DSSUP_RESUME_FROM"] = str(target)
    if resume.kind == "fp32-fallback" and resume.fp32_weights is not None:
        env["DSSUP_RESUME_FROM"] = ""
        env["DSSUP_FP32_WEIGHTS"] = str(resume.fp32_weights)
        env["DSSUP_RESUME_GLOBAL_STEPS"] = str(resume.global_steps)
        env["DSSUP_RESUME_GLOBAL_SAMPLES"] = str(resume.global_samples)
    env["DSSUP_DS_RESUME"] = json.dumps(resume.model_dump(mode="json"), separators=(",", ":"))
    return env
