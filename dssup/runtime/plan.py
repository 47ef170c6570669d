"""The environment contract, read from the worker's side.

``dssup run`` sets these variables on every attempt (the first included); a script launched
without dssup gets the defaults it passes in, so the same script runs with and without dssup.
Only the standard library is used here, so reading the plan never costs a torch import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RuntimePlan", "env_knobs_read", "read_plan"]

# Plan fields the last ``read_plan`` took from DSSUP_* variables: the job-side report says so,
# which is the supervisor's evidence that this script receives those knobs by the environment.
_ENV_KNOBS: set[str] = set()
_KNOB_VARS = {
    "micro_batch": "DSSUP_MICRO_BATCH_SIZE",
    "grad_accum": "DSSUP_GRAD_ACCUM_STEPS",
    "global_batch": "DSSUP_GLOBAL_BATCH_SIZE",
    "recompute": "DSSUP_RECOMPUTE",
    "zero_stage": "DSSUP_ZERO_STAGE",
    "offload": "DSSUP_OFFLOAD",
    "resume": "DSSUP_RESUME_FROM",
    "checkpoint_dir": "DSSUP_CHECKPOINT_DIR",
}


def env_knobs_read() -> tuple[str, ...]:
    """The plan fields ``read_plan`` took from the environment (empty before it ran)."""
    return tuple(sorted(_ENV_KNOBS))


@dataclass(frozen=True)
class RuntimePlan:
    """What this attempt should train with. ``global_batch`` is the invariant dssup keeps."""

    micro_batch: int
    grad_accum: int
    global_batch: int
    recompute: str = "none"
    zero_stage: int = 0
    offload: str = "none"
    resume_from: Path | None = None
    checkpoint_dir: Path | None = None
    attempt: int = 0
    run_dir: Path | None = None
    under_dssup: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self, dp_size: int) -> None:
        """Raise ``ValueError`` unless micro-batch x accumulation x data-parallel = global batch."""
        if self.micro_batch * self.grad_accum * dp_size != self.global_batch:
            raise ValueError(
                f"micro_batch {self.micro_batch} x grad_accum {self.grad_accum} x dp {dp_size} "
                f"!= global_batch {self.global_batch}"
            )


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "")
    return int(raw) if raw.strip() else default


def _path(env: Mapping[str, str], key: str) -> Path | None:
    raw = env.get(key, "")
    return Path(raw) if raw else None


def read_plan(
    micro_batch: int,
    grad_accum: int,
    global_batch: int | None = None,
    recompute: str = "none",
    env: Mapping[str, str] | None = None,
) -> RuntimePlan:
    """The plan for this attempt: the ``DSSUP_*`` variables win over the script's own defaults."""
    env = os.environ if env is None else env
    _ENV_KNOBS.clear()
    _ENV_KNOBS.update(k for k, var in _KNOB_VARS.items() if var in env)
    extra: dict[str, Any] = {}
    plan_file = _path(env, "DSSUP_PLAN_FILE")
    if plan_file is not None and plan_file.is_file():
        extra = dict(json.loads(plan_file.read_text()).get("extra", {}))
    mb = _int(env, "DSSUP_MICRO_BATCH_SIZE", micro_batch)
    gas = _int(env, "DSSUP_GRAD_ACCUM_STEPS", grad_accum)
    return RuntimePlan(
        micro_batch=mb,
        grad_accum=gas,
        global_batch=_int(env, "DSSUP_GLOBAL_BATCH_SIZE", global_batch or 0) or 0,
        recompute=env.get("DSSUP_RECOMPUTE", "") or recompute,
        zero_stage=_int(env, "DSSUP_ZERO_STAGE", 0),
        offload=env.get("DSSUP_OFFLOAD", "") or "none",
        resume_from=_path(env, "DSSUP_RESUME_FROM"),
        checkpoint_dir=_path(env, "DSSUP_CHECKPOINT_DIR"),
        attempt=_int(env, "DSSUP_ATTEMPT", 0),
        run_dir=_path(env, "DSSUP_RUN_DIR"),
        under_dssup="DSSUP_ATTEMPT" in env,
        extra=extra,
    )
