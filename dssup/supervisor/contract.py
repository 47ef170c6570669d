"""How a plan reaches the training script: environment variables and rewritten flags.

Every attempt, the first included, gets the whole environment contract of the architecture
guide (``DSSUP_MICRO_BATCH_SIZE``, ``DSSUP_RESUME_FROM``, ``DSSUP_PLAN_FILE``, ...). Scripts that
take the batch on their command line instead (Megatron-style ``--micro-batch-size``, Hugging
Face ``--per_device_train_batch_size``) get those flags rewritten in place; flags the user did
not pass are never added. Framework-specific rewrites (a DeepSpeed JSON) plug in as
``PlanAdapter``s (see ``adapters.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from dssup.errors import ConfigError
from dssup.supervisor.models import TrainingPlan
from dssup.supervisor.report import ENV_VAR as REPORT_ENV
from dssup.supervisor.report import report_path

__all__ = ["FLAG_FIELDS", "contract_env", "read_plan_flags", "rewrite_flags", "write_plan_file"]

# flag spelling -> plan field. Values are rewritten only where the flag appears.
FLAG_FIELDS: dict[str, str] = {
    "--micro-batch-size": "micro_batch",
    "--micro_batch_size": "micro_batch",
    "--per_device_train_batch_size": "micro_batch",
    "--per-device-train-batch-size": "micro_batch",
    "--train-micro-batch-size-per-gpu": "micro_batch",
    "--gradient-accumulation-steps": "grad_accum",
    "--gradient_accumulation_steps": "grad_accum",
    "--grad-accum-steps": "grad_accum",
    "--global-batch-size": "global_batch",
    "--global_batch_size": "global_batch",
    "--recompute-granularity": "recompute",
    "--gradient_checkpointing": "gradient_checkpointing",
    "--gradient-checkpointing": "gradient_checkpointing",
}


def _value(plan: TrainingPlan, field: str) -> str | None:
    if field == "gradient_checkpointing":
        return "true" if plan.recompute != "none" else "false"
    if field == "recompute":
        return "full" if plan.recompute == "full" else "selective"
    value = getattr(plan, field)
    return None if value is None else str(value)


def rewrite_flags(args: list[str], plan: TrainingPlan) -> list[str]:
    """Worker arguments with known batch/recompute flags set to the plan's values."""
    out: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        name, sep, _ = tok.partition("=")
        field = FLAG_FIELDS.get(name)
        value = _value(plan, field) if field else None
        if field is None or value is None:
            out.append(tok)
            i += 1
        elif sep:
            out.append(f"{name}={value}")
            i += 1
        elif field == "gradient_checkpointing" and (
            i + 1 >= len(args) or args[i + 1].startswith("-")
        ):
            if plan.recompute != "none":
                out.append(tok)  # bare switch: keep on, drop when recompute is off
            i += 1
        else:
            out.extend([tok, value])
            i += 2
    hf = any(a.startswith("--per_device_train_batch_size") for a in args)
    if plan.recompute != "none" and hf and not any(a.split("=")[0] in _GC_FLAGS for a in args):
        out.append("--gradient_checkpointing")  # HF Trainer: switch recompute on
    return out


_GC_FLAGS = {"--gradient_checkpointing", "--gradient-checkpointing"}


MAX_BATCH = 1 << 24  # the CLI's bound on a batch (``dssup/cli/values.py``)


def read_plan_flags(args: list[str]) -> dict[str, int]:
    """Batch settings the user already passes to the script (the initial plan's fallback)."""
    found: dict[str, int] = {}
    for i, tok in enumerate(args):
        name, sep, inline = tok.partition("=")
        field = FLAG_FIELDS.get(name)
        if field not in {"micro_batch", "grad_accum", "global_batch"}:
            continue
        raw = inline if sep else (args[i + 1] if i + 1 < len(args) else "")
        if raw.isdigit():
            if not 1 <= int(raw) <= MAX_BATCH:
                raise ConfigError(
                    f"the command's {name}",
                    f"{raw} is out of range",
                    f"give the script a whole number from 1 to {MAX_BATCH}",
                )
            found[field] = int(raw)
    return found


def write_plan_file(path: Path, plan: TrainingPlan, attempt: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"attempt": attempt, **plan.model_dump(mode="json")}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def contract_env(
    plan: TrainingPlan,
    *,
    attempt: int,
    run_id: str,
    run_dir: Path,
    attempt_dir: Path,
    token: str,
    resume_from: Path | None,
    checkpoint_dir: Path | None,
) -> dict[str, str]:
    """The ``DSSUP_*`` variables (plus allocator settings) for one attempt."""
    env = {
        "DSSUP_ATTEMPT": str(attempt),
        "DSSUP_RUN_ID": run_id,
        "DSSUP_RUN_DIR": str(run_dir),
        "DSSUP_ATTEMPT_DIR": str(attempt_dir),
        "DSSUP_RUN_TOKEN": token,
        "DSSUP_PLAN_FILE": str(attempt_dir / "plan.json"),
        "DSSUP_RECOMPUTE": plan.recompute,
        "DSSUP_ZERO_STAGE": str(plan.zero_stage),
        "DSSUP_OFFLOAD": plan.offload,
        "DSSUP_WORLD_SIZE": str(plan.world_size),
        "DSSUP_DP_SIZE": str(plan.dp),
        "DSSUP_LOAD_TO_CPU": "1" if plan.load_to_cpu else "0",
        "DSSUP_RESUME_FROM": str(resume_from) if resume_from else "",
        "DSSUP_CHECKPOINT_DIR": str(checkpoint_dir) if checkpoint_dir else "",
        REPORT_ENV: str(report_path(attempt_dir)),
    }
    for key, value in (
        ("DSSUP_MICRO_BATCH_SIZE", plan.micro_batch),
        ("DSSUP_GRAD_ACCUM_STEPS", plan.grad_accum),
        ("DSSUP_GLOBAL_BATCH_SIZE", plan.global_batch),
    ):
        env[key] = "" if value is None else str(value)
    if plan.expandable_segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env
