"""PyTorch Lightning scripts driven by ``LightningCLI`` (``python train.py fit --trainer....``).

``LightningCLI`` accepts every ``Trainer`` argument on the command line, so the accumulation is
``--trainer.accumulate_grad_batches`` (always accepted) and a resume is ``--ckpt_path`` (the
``fit`` subcommand's). The batch size belongs to the user's data module: dssup rewrites
``--data.batch_size`` only where the command passes it, and otherwise says the micro-batch
cannot be received. Checkpoints are ``*.ckpt`` files with ``step=N`` in their names under
``--trainer.default_root_dir`` (``lightning_logs/version_*/checkpoints/``). Scripts that build
a ``Trainer`` themselves are plain scripts to dssup (they receive what they define).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dssup.jobreport import ReportRecord
from dssup.supervisor.checkpoints import CheckpointRef
from dssup.supervisor.frameworks.base import (
    Channel,
    Completion,
    Job,
    flag_value,
    has_flag,
    int_flags,
    set_flag,
)
from dssup.supervisor.models import TrainingPlan

__all__ = ["LIGHTNING", "Lightning"]

ACCUM = ("--trainer.accumulate_grad_batches",)
BATCH = ("--data.batch_size", "--data.init_args.batch_size")
RESUME = ("--ckpt_path",)
ROOT = ("--trainer.default_root_dir",)


class Lightning:
    name = "lightning-cli"
    defaults: Mapping[str, int] = MappingProxyType({})  # no defaults of its own

    def detect(self, job: Job) -> str | None:
        return "the script runs LightningCLI" if job.source.mentions("LightningCLI") else None

    def channels(self, job: Job) -> dict[str, Channel]:
        evidence = "LightningCLI always accepts it"
        spelled = has_flag(job.args, BATCH)
        micro = (
            Channel(knob="micro_batch", via="flag", name=spelled, evidence="the command passes it")
            if spelled
            else Channel(
                knob="micro_batch",
                via="none",
                evidence="the batch size belongs to your data module and is not on the command line",
                fix="pass --data.batch_size N (or your data module's name for it)",
            )
        )
        why = "LightningCLI has no switch dssup can set for it"
        return {
            "micro_batch": micro,
            "grad_accum": Channel(
                knob="grad_accum",
                via=("flag" if has_flag(job.args, ACCUM) else "framework-flag"),
                name=ACCUM[0],
                evidence=evidence,
            ),
            "resume": Channel(
                knob="resume", via="framework-flag", name=RESUME[0], evidence=evidence
            ),
            "recompute": Channel(knob="recompute", via="none", evidence=why),
            "zero_stage": Channel(knob="zero_stage", via="none", evidence=why),
            "offload": Channel(knob="offload", via="none", evidence=why),
            "load_to_cpu": Channel(knob="load_to_cpu", via="none", evidence=why),
        }

    def initial(self, job: Job) -> dict[str, Any]:
        found: dict[str, Any] = dict(
            int_flags(job.args, {"micro_batch": BATCH, "grad_accum": ACCUM})
        )
        return found

    def render(
        self, plan: TrainingPlan, job: Job, args: list[str], resume: CheckpointRef | None
    ) -> list[str]:
        out = list(args)
        if plan.micro_batch is not None and (spelled := has_flag(out, BATCH)):
            out = set_flag(out, spelled, str(plan.micro_batch))
        if plan.grad_accum is not None:
            out = set_flag(out, ACCUM, str(plan.grad_accum))
        if resume is not None:
            out = set_flag(out, RESUME, str(resume.path))
        return out

    def environment(self, plan: TrainingPlan, job: Job) -> dict[str, str]:
        return {}

    def checkpoint_dir(self, job: Job) -> tuple[Path, str] | None:
        value = flag_value(job.args, ROOT)
        return (
            (Path(value), ROOT[0])
            if value
            else (Path("."), "Lightning's default root (the working directory)")
        )

    def completed(self, job: Job, since: float, output: str) -> Completion | None:
        return None

    def reported(self, text: str) -> list[ReportRecord]:
        return []


LIGHTNING = Lightning()
