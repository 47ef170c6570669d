"""The DeepSpeed JSON: find it in a command, read the keys dssup plans with, derive the plan.

DeepSpeed takes its config as a file path or as base64-encoded JSON (``--deepspeed``,
``--deepspeed_config``, ``--ds-config`` style flags). dssup reads only a few keys: the batch
triple, ``zero_optimization`` (stage, ``offload_optimizer``, ``offload_param``),
``activation_checkpointing``, ``bf16``/``fp16`` and ``checkpoint.load_universal``. The pydantic
views below name those keys and *ignore* the rest (the user's JSON holds many keys dssup never
interprets, and they must survive untouched: ``render.py`` edits the raw dict, never these
views).

Batch resolution follows DeepSpeed's own rules (``runtime/config.py``): missing members of
``train_batch_size = micro × accumulation × DP`` are derived from the others; a combination that
does not multiply out exactly is a ``ConfigError`` here instead of an assertion at start-up.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dssup.errors import ConfigError

__all__ = [
    "CONFIG_FLAGS",
    "ConfigSource",
    "DeepSpeedPlan",
    "derive_plan",
    "fill_auto",
    "find_config",
    "load_config_value",
]

# Spellings seen in DeepSpeed, HF Trainer, Megatron-DeepSpeed and user scripts.
CONFIG_FLAGS = (
    "--deepspeed_config",
    "--deepspeed-config",
    "--deepspeed",
    "--ds-config",
    "--ds_config",
    "--ds-config-file",
)
Device = Literal["none", "cpu", "nvme"]
_VIEW = ConfigDict(frozen=True, extra="ignore")  # views of user JSON: unknown keys are kept raw


class _Offload(BaseModel):
    model_config = _VIEW
    device: Device = Field("none", description="where the state lives: none (GPU), cpu, nvme")


class _Zero(BaseModel):
    model_config = _VIEW
    stage: int = Field(0, ge=0, le=3, description="ZeRO stage")
    offload_optimizer: _Offload | None = Field(None, description="optimizer-state offload")
    offload_param: _Offload | None = Field(None, description="parameter offload (stage 3)")


class _ActCkpt(BaseModel):
    model_config = _VIEW
    partition_activations: bool = Field(False, description="shard saved activations over MP")
    cpu_checkpointing: bool = Field(False, description="keep checkpointed activations on CPU")
    number_checkpoints: int | None = Field(None, description="checkpointed layers")


class _Enabled(BaseModel):
    model_config = _VIEW
    enabled: bool | Literal["auto"] = Field(False, description="mixed precision on")


class _View(BaseModel):
    model_config = _VIEW
    train_batch_size: int | None = Field(None, ge=1)
    train_micro_batch_size_per_gpu: int | None = Field(None, ge=1)
    gradient_accumulation_steps: int | None = Field(None, ge=1)
    zero_optimization: _Zero = Field(default_factory=_Zero)
    activation_checkpointing: _ActCkpt | None = None
    bf16: _Enabled = Field(default_factory=_Enabled)
    fp16: _Enabled = Field(default_factory=_Enabled)
    checkpoint: dict[str, Any] = Field(default_factory=dict)


class DeepSpeedPlan(BaseModel):
    """The memory-relevant settings a DeepSpeed JSON describes, resolved for a DP size."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    train_batch_size: int = Field(ge=1, description="global batch, sequences per optimizer step")
    micro_batch: int = Field(ge=1, description="train_micro_batch_size_per_gpu")
    grad_accum: int = Field(ge=1, description="gradient_accumulation_steps")
    dp: int = Field(ge=1, description="data-parallel size the triple was resolved for")
    zero_stage: int = Field(0, ge=0, le=3, description="zero_optimization.stage")
    offload_optimizer: Device = Field("none", description="zero_optimization.offload_optimizer")
    offload_param: Device = Field("none", description="zero_optimization.offload_param")
    activation_checkpointing: bool = Field(False, description="activation checkpointing asked")
    bf16: bool = Field(False, description="bf16.enabled")
    fp16: bool = Field(False, description="fp16.enabled")
    load_universal: bool = Field(False, description="checkpoint.load_universal")


class ConfigSource(BaseModel):
    """Where the JSON came from in the worker's arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    flag: str = Field(description="the flag as spelled, e.g. --deepspeed_config")
    index: int = Field(ge=0, description="index of the flag token in the worker arguments")
    inline: bool = Field(description="value given as --flag=value")
    value: str = Field(description="the raw value: a path or base64 JSON")
    path: Path | None = Field(None, description="the file, when the value is a path")


def find_config(args: list[str]) -> ConfigSource | None:
    """The DeepSpeed config flag in worker arguments (first match), or None."""
    for i, tok in enumerate(args):
        name, sep, inline = tok.partition("=")
        if name not in CONFIG_FLAGS:
            continue
        if sep:
            value = inline
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        else:
            continue  # HF/Megatron "--deepspeed" as a bare switch: the JSON comes elsewhere
        path = Path(value)
        return ConfigSource(
            flag=name, index=i, inline=bool(sep), value=value, path=path if path.is_file() else None
        )
    return None


def load_config_value(value: str, base: Path | None = None) -> dict[str, Any]:
    """A DeepSpeed config from a path or base64 JSON (DeepSpeed's own two string forms)."""
    path = Path(value) if base is None else base / value
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(
                str(path), f"not valid JSON ({exc})", "fix the DeepSpeed JSON"
            ) from exc
    else:
        try:
            data = json.loads(base64.urlsafe_b64decode(value.encode()).decode())
        except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
            raise ConfigError(
                "deepspeed config", f"{value[:60]!r} is neither a file nor base64 JSON", ""
            ) from exc
    if not isinstance(data, dict):
        raise ConfigError("deepspeed config", "the JSON is not an object", "")
    return data


def fill_auto(
    raw: dict[str, Any], dp: int, auto: Mapping[str, int | None] | None
) -> dict[str, Any]:
    """The batch keys set to ``"auto"`` filled the way HF's integration fills them
    (``transformers/integrations/deepspeed.py``, ``trainer_config_process``):
    ``train_micro_batch_size_per_gpu`` = the per-device batch, ``gradient_accumulation_steps`` =
    the accumulation, ``train_batch_size`` = world x per-device x accumulation. ``auto`` holds
    the script's ``micro_batch`` and ``grad_accum`` (from its HF flags or HF's defaults); without
    them "auto" cannot be resolved and is refused by name."""
    keys = [k for k in _BATCH_KEYS if raw.get(k) == "auto"]
    if not keys:
        return raw
    mb, gas = (auto or {}).get("micro_batch"), (auto or {}).get("grad_accum")
    if mb is None or gas is None:
        raise ConfigError(
            keys[0],
            '"auto" batch values are filled by HF Trainer (or accelerate) from the script\'s '
            "per-device batch and accumulation, and this command gives dssup neither",
            "run an HF Trainer script (--per_device_train_batch_size, --gradient_accumulation_steps),"
            " pass --micro-batch-size and --grad-accum to dssup, or set numbers in the JSON",
        )
    values = {
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": gas,
        "train_batch_size": mb * gas * dp,
    }
    return {**raw, **{k: values[k] for k in keys}}


def _view(raw: dict[str, Any]) -> _View:
    if any(raw.get(k) == "auto" for k in _BATCH_KEYS):
        raise ConfigError(
            "train_batch_size",
            '"auto" batch values are filled in by HF Trainer, not DeepSpeed',
            "run an HF Trainer script, pass --micro-batch-size and --grad-accum to dssup, or set "
            "the batch keys to numbers",
        )
    try:
        return _View.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(field, err["msg"], "fix the DeepSpeed JSON") from exc


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def resolve_batch(tb: int | None, mb: int | None, gas: int | None, dp: int) -> tuple[int, int, int]:
    """DeepSpeed's resolution of the batch triple; raises ConfigError where it would assert."""
    if tb is None and mb is None:
        raise ConfigError(
            "train_batch_size", "neither it nor train_micro_batch_size_per_gpu is set", ""
        )
    if tb is not None and mb is not None and gas is None:
        gas = tb // mb // dp
    elif tb is not None and gas is not None and mb is None:
        mb = tb // dp // gas
    elif mb is not None and tb is None:
        gas = gas or 1
        tb = mb * gas * dp
    elif tb is not None and mb is None:
        gas, mb = 1, tb // dp
    if not (tb and mb and gas) or mb * gas * dp != tb:
        raise ConfigError(
            "train_batch_size",
            f"{tb} != micro {mb} x accumulation {gas} x DP {dp}",
            "make train_batch_size = train_micro_batch_size_per_gpu x "
            "gradient_accumulation_steps x data-parallel size",
        )
    return tb, mb, gas


def derive_plan(
    raw: dict[str, Any], dp: int, auto: Mapping[str, int | None] | None = None
) -> DeepSpeedPlan:
    """What the JSON asks for, with the batch triple resolved for ``dp`` data-parallel ranks
    (``"auto"`` batch values filled from ``auto`` as HF does: ``fill_auto``)."""
    v = _view(fill_auto(raw, dp, auto) if auto is not None else raw)
    tb, mb, gas = resolve_batch(
        v.train_batch_size, v.train_micro_batch_size_per_gpu, v.gradient_accumulation_steps, dp
    )
    z = v.zero_optimization
    ac = v.activation_checkpointing
    return DeepSpeedPlan(
        train_batch_size=tb,
        micro_batch=mb,
        grad_accum=gas,
        dp=dp,
        zero_stage=z.stage,
        offload_optimizer=z.offload_optimizer.device if z.offload_optimizer else "none",
        offload_param=z.offload_param.device if z.offload_param else "none",
        activation_checkpointing=bool(ac and (ac.number_checkpoints or ac.partition_activations)),
        bf16=v.bf16.enabled is True,
        fp16=v.fp16.enabled is True,
        load_universal=bool(v.checkpoint.get("load_universal", False)),
    )
