"""Hugging Face ``Trainer`` scripts (and TRL's trainers) that parse ``TrainingArguments`` from
the command line with ``HfArgumentParser`` (TRL: ``TrlParser``), like ``run_clm.py``.

Such a script accepts every ``TrainingArguments`` flag whether or not the command passes it,
so dssup sets ``--per_device_train_batch_size`` and ``--gradient_accumulation_steps`` (HF's
defaults, 8 and 1, are the plan's starting point when absent), switches
``--gradient_checkpointing`` (on/off only: selective and full recompute are one run here), and
resumes with ``--resume_from_checkpoint <output_dir>/checkpoint-N`` when the script passes
``training_args.resume_from_checkpoint`` to ``trainer.train`` (stock scripts do; the source is
checked). Checkpoints are ``checkpoint-N`` under ``--output_dir`` (HF's default
``trainer_output`` when absent).

What the Trainer itself says is read back: its "***** Running training *****" block on rank 0
("Instantaneous batch size per device", "Total train batch size (w. parallel, distributed &
accumulation)", "Gradient Accumulation steps", the step it resumes from) becomes a ``started``
record of the job-side report, so the global batch is verified without any change to the
script; "Training completed." on rank 0, or a ``trainer_state.json`` whose ``global_step``
reached ``max_steps`` (the final one, or the latest checkpoint's), says training finished, and
a finished run is never relaunched (a 5.x resume from ``checkpoint-N`` with ``--max_steps N``
would train one step more). The Trainer prints that line *before* the script's own
``save_model``/``save_state``, so a failure after it is a harmless teardown only when the
final save is seen whole: a ``trainer_state.json`` this attempt wrote to ``--output_dir``
(stock scripts' last save, after ``save_model``) or whole model files written by it
(``final_save``), and no cut-short model file beside them. Otherwise the run trained but its
end is unverified, and dssup says so instead of "succeeded".
"""

from __future__ import annotations

import json
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
    flag_value,
    has_flag,
    int_flags,
    set_flag,
)
from dssup.supervisor.frameworks.final_save import final_save, fresh
from dssup.supervisor.models import TrainingPlan

__all__ = ["HF", "HuggingFaceTrainer", "hf_batch"]

MICRO = ("--per_device_train_batch_size", "--per-device-train-batch-size")
ACCUM = ("--gradient_accumulation_steps", "--gradient-accumulation-steps")
CKPT = ("--gradient_checkpointing", "--gradient-checkpointing")
RESUME = ("--resume_from_checkpoint", "--resume-from-checkpoint")
OUTPUT = ("--output_dir", "--output-dir")
MAX_STEPS = ("--max_steps", "--max-steps")
DEFAULT_MICRO, DEFAULT_ACCUM, DEFAULT_OUTPUT = 8, 1, "trainer_output"
_PARSERS = ("HfArgumentParser", "TrlParser")
_ARGS = ("TrainingArguments", "SFTConfig", "DPOConfig", "GRPOConfig", "RewardConfig", "PPOConfig",
         "ORPOConfig", "KTOConfig", "CPOConfig", "Seq2SeqTrainingArguments")  # fmt: skip
_FIG = {
    "micro": re.compile(r"Instantaneous batch size per device = ([\d,]+)"),
    "adjusted": re.compile(r"batch size has been adjusted to: ([\d,]+)"),
    "total": re.compile(r"Total train batch size \(w\. parallel, distributed & accumulation\) = ([\d,]+)"),
    "accum": re.compile(r"Gradient Accumulation steps = (\d+)"),
    "resume": re.compile(r"(?:Resuming training from checkpoint with epoch \d+ and|Continuing training from) global step (\d+)"),
}  # fmt: skip
_DONE = "Training completed. Do not forget to share your model"
_TRUE = {"true", "1", "yes", "y", "t", ""}


def _int(raw: str | None, default: int) -> int:
    return int(raw) if raw and raw.isdigit() else default


def hf_batch(args: list[str]) -> tuple[int, int]:
    """(per-device batch, accumulation) ``TrainingArguments`` gets from these arguments."""
    return (
        _int(flag_value(args, MICRO), DEFAULT_MICRO),
        _int(flag_value(args, ACCUM), DEFAULT_ACCUM),
    )


def _state(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _finished(state: dict[str, Any] | None) -> bool:
    if state is None:
        return False
    step, last = state.get("global_step"), state.get("max_steps")
    return isinstance(step, int) and isinstance(last, int) and 0 < last <= step


class HuggingFaceTrainer:
    name = "hf-trainer"
    # TrainingArguments' own defaults, the plan's starting point where the command gives none
    defaults: Mapping[str, int] = MappingProxyType(
        {"micro_batch": DEFAULT_MICRO, "grad_accum": DEFAULT_ACCUM}
    )

    def detect(self, job: Job) -> str | None:
        parser = job.source.mentions(*_PARSERS)
        args = job.source.mentions(*_ARGS)
        if parser and args:
            trl = " (TRL)" if "trl" in job.source.text else ""
            return f"the script parses {args} with {parser}{trl}"
        return None

    def _json_args(self, job: Job) -> bool:
        return len(job.args) == 1 and job.args[0].endswith(".json")

    def channels(self, job: Job) -> dict[str, Channel]:
        if self._json_args(job):
            why = f"the script reads its arguments from {job.args[0]}, which dssup does not rewrite"
            fix = "pass the TrainingArguments on the command line instead"
            return {k: Channel(knob=k, via="none", evidence=why, fix=fix)
                    for k in ("micro_batch", "grad_accum", "recompute", "resume")}  # fmt: skip
        evidence = "TrainingArguments always accept it"

        def flag(knob: str, names: tuple[str, ...], boolean: bool = False) -> Channel:
            spelled = has_flag(job.args, names)
            via = "flag" if spelled else "framework-flag"
            return Channel(knob=knob, via=via, name=spelled or names[0], evidence=evidence,
                           boolean=boolean)  # fmt: skip

        out = {
            "micro_batch": flag("micro_batch", MICRO),
            "grad_accum": flag("grad_accum", ACCUM),
            "recompute": flag("recompute", CKPT, boolean=True),
        }
        if "resume_from_checkpoint" in job.source.text:
            out["resume"] = Channel(knob="resume", via="framework-flag", name=RESUME[0],
                                    evidence="the script passes it to trainer.train")  # fmt: skip
        else:
            out["resume"] = Channel(
                knob="resume", via="none",
                evidence="the script never passes resume_from_checkpoint to trainer.train",
                fix="call trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)",
            )  # fmt: skip
        why = "HF Trainer loads checkpoints its own way; dssup has no switch for it"
        out["load_to_cpu"] = Channel(knob="load_to_cpu", via="none", evidence=why)
        return out

    def initial(self, job: Job) -> dict[str, Any]:
        """What the command sets (HF's defaults are ``defaults``, used where they agree)."""
        if self._json_args(job):
            return {}
        found: dict[str, Any] = dict(
            int_flags(job.args, {"micro_batch": MICRO, "grad_accum": ACCUM})
        )
        switch = flag_value(job.args, CKPT)
        if switch is not None and switch.lower() in _TRUE:
            found["recompute"] = "full"
        return found

    def render(
        self, plan: TrainingPlan, job: Job, args: list[str], resume: CheckpointRef | None
    ) -> list[str]:
        if self._json_args(job):
            return list(args)
        out = list(args)
        if plan.micro_batch is not None:
            out = set_flag(out, has_flag(out, MICRO) or MICRO, str(plan.micro_batch))
        if plan.grad_accum is not None:
            out = set_flag(out, has_flag(out, ACCUM) or ACCUM, str(plan.grad_accum))
        on = plan.recompute != "none"
        if on or has_flag(out, CKPT):
            out = set_flag(out, has_flag(out, CKPT) or CKPT, "true" if on else "false")
        if resume is not None and "resume_from_checkpoint" in job.source.text:
            out = set_flag(out, has_flag(out, RESUME) or RESUME, str(resume.path))
        return out

    def output_dir(self, job: Job) -> Path:
        if self._json_args(job):
            doc = _state(Path(job.args[0]))  # the arguments file the script parses
            value = (doc or {}).get("output_dir")
            return Path(value) if isinstance(value, str) and value else Path(DEFAULT_OUTPUT)
        return Path(flag_value(job.args, OUTPUT) or DEFAULT_OUTPUT)

    def checkpoint_dir(self, job: Job) -> tuple[Path, str] | None:
        spelled = has_flag(job.args, OUTPUT)
        if self._json_args(job) and self.output_dir(job) != Path(DEFAULT_OUTPUT):
            spelled = f"output_dir in {job.args[0]}"
        return self.output_dir(job), spelled or "HF's default output_dir"

    def environment(self, plan: TrainingPlan, job: Job) -> dict[str, str]:
        return {}

    def completed(self, job: Job, since: float, output: str) -> Completion | None:
        training = self._trained(job, since, output)
        if training is None:
            return None
        out = self.output_dir(job)
        found = final_save(out, since)
        final = out / "trainer_state.json"
        if found.broken:
            return Completion(training=training, unverified=(
                f"the final save in {out} is cut short: {'; '.join(found.broken)}"))  # fmt: skip
        if fresh(final, since) and _finished(_state(final)):
            models = f"; {', '.join(found.whole)} whole" if found.whole else ""
            return Completion(training=training, saved=(
                f"{final} (the script's last save) was written by this attempt with "
                f"global_step >= max_steps{models}"))  # fmt: skip
        if found.whole:
            return Completion(training=training, saved=(
                f"{', '.join(found.whole)} in {out}, written by this attempt, whole "
                "(their headers and sizes agree)"))  # fmt: skip
        return Completion(training=training, unverified=(
            f"this attempt wrote no trainer_state.json and no model file to {out} after "
            "training: the script's final save may not have run"))  # fmt: skip

    def _trained(self, job: Job, since: float, output: str) -> str | None:
        """Evidence that the training loop itself finished, or None."""
        if _DONE in output:
            return 'rank 0 printed the Trainer\'s "Training completed."'
        out = self.output_dir(job)
        final = out / "trainer_state.json"
        if fresh(final, since) and _finished(_state(final)):
            return f"{final} shows global_step >= max_steps (written by this attempt)"
        steps = sorted(out.glob("checkpoint-*/trainer_state.json"),
                       key=lambda p: int(m.group(1)) if (m := re.search(r"-(\d+)$", p.parent.name)) else -1)  # fmt: skip
        if steps and _finished(_state(steps[-1])):
            return f"{steps[-1]} shows global_step >= max_steps: training is complete"
        return None

    def reported(self, text: str) -> list[ReportRecord]:
        """``started`` records from the Trainer's own "Running training" blocks (rank 0)."""
        out: list[ReportRecord] = []
        for block in text.split("***** Running training *****")[1:]:
            found = {k: p.search(block) for k, p in _FIG.items()}
            micro, total, accum = found["micro"], found["total"], found["accum"]
            if not (micro and total and accum):
                continue
            mb = int((found["adjusted"] or micro).group(1).replace(",", ""))
            gb, gas = int(total.group(1).replace(",", "")), int(accum.group(1))
            dp = max(1, gb // (mb * gas))
            first = int(found["resume"].group(1)) if found["resume"] else 0
            out.append(Started(rank=0, world_size=dp, dp=dp, micro_batch=mb, grad_accum=gas,
                               global_batch=gb, first_step=first, framework=self.name,
                               source="hf-trainer-log"))  # fmt: skip
        return out


HF = HuggingFaceTrainer()
