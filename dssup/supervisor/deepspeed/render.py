"""Write the next attempt's DeepSpeed JSON: the user's config with only dssup's changes applied.

The user's dict is deep-copied and edited key by key; every key dssup does not plan with stays
exactly as written (order included). The batch triple is always written in full so that
DeepSpeed derives nothing, and ``train_batch_size = micro × accumulation × DP`` is checked before
anything is written. Each change is recorded with the reason, for the journal and the log. The
file is written atomically (temporary file in the same directory, then rename), so a relaunch
never reads half a config.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dssup.errors import ConfigError
from dssup.supervisor.deepspeed.config import DeepSpeedPlan

__all__ = ["ConfigChange", "render_config", "write_json_atomic"]

_WHY = {
    "train_batch_size": "global batch (kept exact)",
    "train_micro_batch_size_per_gpu": "micro-batch per rank",
    "gradient_accumulation_steps": "accumulation keeps the global batch exact",
    "zero_optimization.stage": "ZeRO stage",
    "zero_optimization.offload_optimizer.device": "optimizer states offloaded",
    "zero_optimization.offload_param.device": "parameters offloaded (ZeRO-3)",
    "activation_checkpointing.number_checkpoints": "activation recompute",
    "checkpoint.load_universal": "resume from a universal checkpoint",
    "zero_force_ds_cpu_optimizer": "offload with the script's own optimizer",
}


class ConfigChange(BaseModel):
    """One key dssup changed in the user's JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    key: str = Field(description="dotted path in the JSON")
    before: Any = Field(description="the user's value (None when absent)")
    after: Any = Field(description="the value written")
    why: str = Field(description="what the change is for")

    def line(self) -> str:
        return f"{self.key}: {self.before!r} -> {self.after!r} ({self.why})"


def _get(d: dict[str, Any], dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _set(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = d
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def _targets(plan: DeepSpeedPlan, raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "train_batch_size": plan.train_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "zero_optimization.stage": plan.zero_stage,
    }
    for key, device in (
        ("zero_optimization.offload_optimizer.device", plan.offload_optimizer),
        ("zero_optimization.offload_param.device", plan.offload_param),
    ):
        if device != "none" or _get(raw, key.rsplit(".", 1)[0]) is not None:
            out[key] = device
    ac_key = "activation_checkpointing.number_checkpoints"
    if plan.activation_checkpointing:
        out[ac_key] = _get(raw, ac_key) or 1
    elif _get(raw, ac_key):
        out[ac_key] = None
    # No optimizer section: the script passes its own (torch) optimizer, which DeepSpeed
    # refuses to offload unless told it may ("zero_force_ds_cpu_optimizer").
    own_optimizer = "optimizer" not in raw and "zero_force_ds_cpu_optimizer" not in raw
    if plan.offload_optimizer != "none" and own_optimizer:
        out["zero_force_ds_cpu_optimizer"] = False
    if plan.load_universal or _get(raw, "checkpoint.load_universal") is not None:
        out["checkpoint.load_universal"] = plan.load_universal
    return out


def render_config(
    raw: dict[str, Any], plan: DeepSpeedPlan, reasons: dict[str, str] | None = None
) -> tuple[dict[str, Any], list[ConfigChange]]:
    """The user's JSON with ``plan`` applied, and the list of what changed and why."""
    if plan.micro_batch * plan.grad_accum * plan.dp != plan.train_batch_size:
        raise ConfigError(
            "train_batch_size",
            f"{plan.train_batch_size} != {plan.micro_batch} x {plan.grad_accum} x DP {plan.dp}",
            "this is a dssup bug: the global batch must stay exact",
        )
    if plan.offload_param != "none" and plan.zero_stage != 3:
        raise ConfigError("zero_optimization.offload_param", "needs ZeRO stage 3", "")
    if plan.offload_optimizer != "none" and plan.zero_stage == 0:
        raise ConfigError("zero_optimization.offload_optimizer", "needs ZeRO stage 1-3", "")
    out = copy.deepcopy(raw)
    changes: list[ConfigChange] = []
    for key, value in _targets(plan, raw).items():
        before = _get(raw, key)
        if before == value:
            continue
        _set(out, key, value)
        why = (reasons or {}).get(key) or _WHY.get(key, "dssup plan")
        changes.append(ConfigChange(key=key, before=before, after=value, why=why))
    return out, changes


def write_json_atomic(path: Path, data: dict[str, Any]) -> Path:
    """Write ``data`` as JSON to ``path`` so that readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
