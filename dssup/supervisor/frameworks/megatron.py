"""Megatron-LM scripts (``pretrain_gpt.py`` and friends, or anything importing ``megatron``).

Megatron takes ``--micro-batch-size`` and ``--global-batch-size`` and derives the number of
micro-batches per step itself (global / (micro x data-parallel)), so dssup sets those two and
never an accumulation flag. Recompute is ``--recompute-granularity selective`` or ``full``
(with ``--recompute-method uniform --recompute-num-layers 1``, which full needs). Checkpoints
are ``iter_NNNNNNN`` under ``--save`` with ``latest_checkpointed_iteration.txt``, written last;
a resume is ``--load <save dir>`` (Megatron then loads the tracker's iteration). Rank 0 prints
its arguments at start-up (``micro_batch_size``, ``global_batch_size``, ``data_parallel_size``),
which become the job-side report's ``started`` record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dssup.jobreport import ReportRecord, Started
from dssup.supervisor.checkpoints import CheckpointRef
from dssup.supervisor.frameworks.base import (
    Channel,
    Completion,
    Job,
    drop_flag,
    flag_value,
    has_flag,
    int_flags,
    set_flag,
)
from dssup.supervisor.models import TrainingPlan

__all__ = ["MEGATRON", "Megatron"]

MICRO, GLOBAL = ("--micro-batch-size",), ("--global-batch-size",)
GRANULARITY, METHOD, LAYERS = (
    ("--recompute-granularity",),
    ("--recompute-method",),
    ("--recompute-num-layers",),
)
_ARG = re.compile(
    r"^\s*(micro_batch_size|global_batch_size|data_parallel_size|world_size)\s*\.+\s*(\d+)\s*$",
    re.M,
)
_EVIDENCE = "Megatron's arguments always accept it"


class Megatron:
    name = "megatron"
    defaults: Mapping[str, int] = MappingProxyType({})  # no defaults of its own

    def detect(self, job: Job) -> str | None:
        if found := job.source.mentions("from megatron", "import megatron"):
            return f"the script uses Megatron ({found!r})"
        if Path(job.command.script).name.startswith("pretrain_") and has_flag(job.args, MICRO):
            return (
                f"{Path(job.command.script).name} with --micro-batch-size (Megatron's entry point)"
            )
        return None

    def channels(self, job: Job) -> dict[str, Channel]:
        def flag(knob: str, names: tuple[str, ...], evidence: str = _EVIDENCE) -> Channel:
            spelled = has_flag(job.args, names)
            return Channel(knob=knob, via="flag" if spelled else "framework-flag",
                           name=spelled or names[0], evidence=evidence)  # fmt: skip

        why = "Megatron has no switch dssup can set for it"
        return {
            "micro_batch": flag("micro_batch", MICRO),
            "grad_accum": Channel(
                knob="grad_accum",
                via="derived",
                name=GLOBAL[0],
                evidence="Megatron derives it from the global batch",
            ),
            "recompute": flag("recompute", GRANULARITY),
            "resume": flag("resume", ("--load",), "Megatron loads the tracker's iteration"),
            "zero_stage": Channel(knob="zero_stage", via="none", evidence=why),
            "offload": Channel(knob="offload", via="none", evidence=why),
            "load_to_cpu": Channel(knob="load_to_cpu", via="none", evidence=why),
        }

    def initial(self, job: Job) -> dict[str, Any]:
        found: dict[str, Any] = dict(
            int_flags(job.args, {"micro_batch": MICRO, "global_batch": GLOBAL})
        )
        gran = flag_value(job.args, GRANULARITY)
        if gran in {"selective", "full"}:
            found["recompute"] = gran
        return found

    def render(
        self, plan: TrainingPlan, job: Job, args: list[str], resume: CheckpointRef | None
    ) -> list[str]:
        out = list(args)
        if plan.micro_batch is not None:
            out = set_flag(out, MICRO, str(plan.micro_batch))
        if plan.global_batch is not None:
            out = set_flag(out, GLOBAL, str(plan.global_batch))
        if plan.recompute == "none":
            for names in (GRANULARITY, METHOD, LAYERS):
                out = drop_flag(out, names, takes_value=True)
        else:
            out = set_flag(out, GRANULARITY, plan.recompute)
            if plan.recompute == "full":
                out = set_flag(out, METHOD, flag_value(out, METHOD) or "uniform")
                out = set_flag(out, LAYERS, flag_value(out, LAYERS) or "1")
        saved = self.checkpoint_dir(job)
        if resume is not None and saved is not None:
            out = set_flag(out, ("--load",), str(saved[0]))
        return out

    def environment(self, plan: TrainingPlan, job: Job) -> dict[str, str]:
        return {}

    def checkpoint_dir(self, job: Job) -> tuple[Path, str] | None:
        value = flag_value(job.args, ("--save",))
        return (Path(value), "--save") if value else None

    def completed(self, job: Job, since: float, output: str) -> Completion | None:
        return None

    def reported(self, text: str) -> list[ReportRecord]:
        found = {k: int(v) for k, v in _ARG.findall(text)}
        mb, gb, dp = (
            found.get("micro_batch_size"),
            found.get("global_batch_size"),
            found.get("data_parallel_size"),
        )
        if not (mb and gb and dp):
            return []
        gas = max(1, gb // (mb * dp))
        return [Started(rank=0, world_size=found.get("world_size") or dp, dp=dp, micro_batch=mb,
                        grad_accum=gas, global_batch=gb, framework=self.name,
                        source="megatron-arguments-log")]  # fmt: skip


MEGATRON = Megatron()
