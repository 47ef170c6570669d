"""A plain script (argparse + DDP/FSDP, or anything not recognised as a framework).

Such a script receives exactly what it defines. A knob reaches it when

* its flag is on the command line (``--micro-batch-size``, ``--gradient-accumulation-steps``,
  ... see ``FLAGS``): dssup rewrites the value in place (it never adds a flag the script may
  not define);
* or the script reads the environment contract: its source calls ``read_plan`` (which reads
  every ``DSSUP_*`` batch variable) or names the variable (``DSSUP_GRAD_ACCUM_STEPS``). That is
  evidence, not proof; the job-side report checks it after the attempt.

Otherwise the knob is not received, and a remedy that needs it is not used: the hand-off says
which flag to add. The checkpoint directory comes from ``--checkpoint-dir``-style flags.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dssup.jobreport import ReportRecord
from dssup.supervisor.checkpoints import CheckpointRef
from dssup.supervisor.contract import FLAG_FIELDS, read_plan_flags, rewrite_flags
from dssup.supervisor.frameworks.base import Channel, Completion, Job, flag_value, has_flag
from dssup.supervisor.models import TrainingPlan

__all__ = ["FLAGS", "PLAIN", "Plain", "env_channel"]

# knob -> the spellings of contract.FLAG_FIELDS (one table of the flags dssup rewrites)
FLAGS: dict[str, tuple[str, ...]] = {
    knob: tuple(flag for flag, field in FLAG_FIELDS.items() if field == knob)
    for knob in ("micro_batch", "grad_accum", "global_batch", "recompute")
}
_SWITCH = tuple(flag for flag, field in FLAG_FIELDS.items() if field == "gradient_checkpointing")
CHECKPOINT_FLAGS = (
    "--checkpoint-dir", "--checkpoint_dir", "--ckpt-dir", "--ckpt_dir", "--save-dir",
    "--save_dir", "--output-dir", "--output_dir", "--save",
)  # fmt: skip
_VARS = {
    "micro_batch": "DSSUP_MICRO_BATCH_SIZE",
    "grad_accum": "DSSUP_GRAD_ACCUM_STEPS",
    "recompute": "DSSUP_RECOMPUTE",
    "zero_stage": "DSSUP_ZERO_STAGE",
    "offload": "DSSUP_OFFLOAD",
    "load_to_cpu": "DSSUP_LOAD_TO_CPU",
    "resume": "DSSUP_RESUME_FROM",
}
_READ_PLAN = re.compile(r"\bread_plan\s*\(")
_FLAG_DEF = r"""add_argument\(\s*['"]({flags})['"]"""


def env_channel(job: Job, knob: str) -> Channel | None:
    """The ``DSSUP_*`` variable of ``knob``, when the source shows the script reads it."""
    var = _VARS[knob]
    if var in job.source.text:
        return Channel(knob=knob, via="env", name=var, evidence=f"the script's source names {var}")
    if knob not in {"zero_stage", "offload", "load_to_cpu"} and _READ_PLAN.search(job.source.text):
        evidence = "the script calls dssup.runtime.read_plan"
        return Channel(knob=knob, via="env", name=var, evidence=evidence)
    return None


def _defined(job: Job, flags: tuple[str, ...]) -> str | None:
    """A flag of ``flags`` the script's own argparse defines (it is not on the command line)."""
    pattern = re.compile(_FLAG_DEF.format(flags="|".join(re.escape(f) for f in flags)))
    m = pattern.search(job.source.text)
    return m.group(1) if m else None


def _missing(job: Job, knob: str, what: str, flags: tuple[str, ...] = ()) -> Channel:
    own = _defined(job, flags) if flags else None
    if own:
        fix = f"add {own} N to the command (your script defines it), or read {_VARS[knob]}"
    else:
        fix = f"pass it on the command line, or read {_VARS[knob]} (dssup.runtime.read_plan)"
    if not job.source.text:
        evidence = (
            f"no flag for it on the command line and the source is unknown ({job.source.why})"
        )
    else:
        evidence = (
            f"no flag for the {what} on the command line and the script never reads {_VARS[knob]}"
        )
    return Channel(knob=knob, via="none", evidence=evidence, fix=fix)


class Plain:
    name = "plain"
    defaults: Mapping[str, int] = MappingProxyType({})  # no defaults of its own

    def detect(self, job: Job) -> str | None:
        return "no framework recognised: the script receives what it defines"

    def channels(self, job: Job) -> dict[str, Channel]:
        out: dict[str, Channel] = {}
        for knob, what in (("micro_batch", "micro-batch"), ("grad_accum", "accumulation")):
            flag = has_flag(job.args, FLAGS[knob])
            if flag:
                out[knob] = Channel(
                    knob=knob, via="flag", name=flag, evidence="the command passes it"
                )
            elif (
                (gb := has_flag(job.args, FLAGS["global_batch"]))
                and knob == "grad_accum"
                and (has_flag(job.args, FLAGS["micro_batch"]))
            ):
                evidence = (
                    "the script derives it from the global and micro-batch flags (unverified)"
                )
                out[knob] = Channel(knob=knob, via="derived", name=gb, evidence=evidence)
            else:
                out[knob] = env_channel(job, knob) or _missing(job, knob, what, FLAGS[knob])
        out["recompute"] = self._recompute(job)
        for knob in ("zero_stage", "offload", "load_to_cpu", "resume"):
            found = env_channel(job, knob)
            out[knob] = found or _missing(job, knob, knob.replace("_", " "))
        return out

    def _recompute(self, job: Job) -> Channel:
        if flag := has_flag(job.args, FLAGS["recompute"]):
            return Channel(
                knob="recompute", via="flag", name=flag, evidence="the command passes it"
            )
        if flag := has_flag(job.args, _SWITCH):
            return Channel(knob="recompute", via="flag", name=flag, boolean=True,
                           evidence="the command passes it (on/off only)")  # fmt: skip
        return env_channel(job, "recompute") or _missing(job, "recompute", "recompute")

    def initial(self, job: Job) -> dict[str, Any]:
        return dict(read_plan_flags(job.args))

    def render(
        self, plan: TrainingPlan, job: Job, args: list[str], resume: CheckpointRef | None
    ) -> list[str]:
        return rewrite_flags(args, plan)

    def checkpoint_dir(self, job: Job) -> tuple[Path, str] | None:
        flag = has_flag(job.args, CHECKPOINT_FLAGS)
        value = flag_value(job.args, CHECKPOINT_FLAGS) if flag else None
        return (Path(value), flag) if value and flag else None

    def environment(self, plan: TrainingPlan, job: Job) -> dict[str, str]:
        return {}

    def completed(self, job: Job, since: float, output: str) -> Completion | None:
        return None

    def reported(self, text: str) -> list[ReportRecord]:
        return []


PLAIN = Plain()
