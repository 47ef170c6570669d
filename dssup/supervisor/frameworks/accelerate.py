"""Scripts with their own ``accelerate`` loop (``Accelerator`` + ``accelerator.accumulate``).

``Accelerator()`` takes the accumulation from ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` when
no ``GradientAccumulationPlugin`` is passed (accelerate 1.15 ``accelerator.py``: the variable
wins over the argument), and ``accelerator.accumulate(model)`` makes it count; with both in the
source dssup sets that variable. Everything else (the micro-batch, checkpoints, resume) is the
script's own, as for a plain script: flags on the command line or the ``DSSUP_*`` contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dssup.jobreport import ReportRecord
from dssup.supervisor.checkpoints import CheckpointRef
from dssup.supervisor.frameworks.base import Channel, Completion, Job
from dssup.supervisor.frameworks.plain import PLAIN
from dssup.supervisor.models import TrainingPlan

__all__ = ["ACCELERATE_LOOP", "VARIABLE", "AccelerateLoop"]

VARIABLE = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"


class AccelerateLoop:
    name = "accelerate"
    defaults: Mapping[str, int] = MappingProxyType({})  # no defaults of its own

    def detect(self, job: Job) -> str | None:
        if job.source.mentions("Accelerator(") and job.source.mentions(".accumulate("):
            return "the script builds an Accelerator and accumulates with accelerator.accumulate"
        return None

    def _plugin(self, job: Job) -> bool:
        return "GradientAccumulationPlugin" in job.source.text

    def channels(self, job: Job) -> dict[str, Channel]:
        out = PLAIN.channels(job)
        if not self._plugin(job) and out["grad_accum"].via in {"none", "derived"}:
            out["grad_accum"] = Channel(
                knob="grad_accum", via="env", name=VARIABLE,
                evidence="Accelerator() reads it and the loop uses accelerator.accumulate",
            )  # fmt: skip
        return out

    def initial(self, job: Job) -> dict[str, Any]:
        return PLAIN.initial(job)

    def render(
        self, plan: TrainingPlan, job: Job, args: list[str], resume: CheckpointRef | None
    ) -> list[str]:
        return PLAIN.render(plan, job, args, resume)

    def environment(self, plan: TrainingPlan, job: Job) -> dict[str, str]:
        if self.channels(job)["grad_accum"].name == VARIABLE and plan.grad_accum is not None:
            return {VARIABLE: str(plan.grad_accum)}
        return {}

    def checkpoint_dir(self, job: Job) -> tuple[Path, str] | None:
        return PLAIN.checkpoint_dir(job)

    def completed(self, job: Job, since: float, output: str) -> Completion | None:
        return None

    def reported(self, text: str) -> list[ReportRecord]:
        return []


ACCELERATE_LOOP = AccelerateLoop()
