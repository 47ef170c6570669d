"""What every framework hand-off provides, and what it works from.

A *framework* is how the training script takes its settings: a stock Hugging Face ``Trainer``
script takes ``--per_device_train_batch_size`` whether or not the command passes it, Megatron
derives the accumulation from ``--global-batch-size``, a plain script takes only what it
defines (flags on its command line, the ``DSSUP_*`` environment if it reads it). Each framework
is one module with one object behind ``Framework``:

* ``detect``: evidence that the script is of this framework (its source, its flags), or None;
* ``channels``: how each knob of dssup's plan reaches the script (``Channel``), or why not;
* ``initial``: the batch settings the command itself sets (``defaults``: the framework's own);
* ``render``: the worker arguments for a plan and a checkpoint to resume from;
* ``checkpoint_dir``: where the script saves, read from the command;
* ``completed`` / ``reported``: what the framework itself says about an attempt (that training
  finished, and whether the script's final save is whole; the batch figures it prints).

``Job`` is the parsed command plus the script's source, read once (never executed).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from dssup.jobreport import ReportRecord
from dssup.supervisor.checkpoints import CheckpointRef
from dssup.supervisor.launchers.base import LaunchCommand
from dssup.supervisor.models import TrainingPlan

__all__ = [
    "KNOBS",
    "Channel",
    "Completion",
    "Framework",
    "Job",
    "ScriptSource",
    "flag_value",
    "has_flag",
    "int_flags",
    "read_source",
    "set_flag",
]

# Plan fields a remedy may change, and the resume hand-off.
KNOBS = (
    "micro_batch",
    "grad_accum",
    "recompute",
    "zero_stage",
    "offload",
    "expandable_segments",
    "load_to_cpu",
    "resume",
)
Via = Literal["flag", "framework-flag", "launcher-flag", "env", "config", "derived", "none"]


class Completion(BaseModel):
    """What a framework shows of an attempt that trained to the end.

    ``training`` is the evidence that the training loop finished; ``saved`` the evidence that
    the script's own final save (after the loop) is whole, or None with ``unverified`` saying
    what was looked for and not found. A failure after training is a harmless teardown only
    with ``saved``; without it the run has trained but cannot be called a success."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    training: str = Field(description="evidence the training loop finished")
    saved: str | None = Field(None, description="evidence the script's final save is whole")
    unverified: str = Field("", description="when saved is None: what was not found, and where")


class Channel(BaseModel):
    """How one knob reaches the script."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    knob: str = Field(description="plan field (micro_batch, grad_accum, ...) or 'resume'")
    via: Via = Field(description="flag on the command line, a flag the framework always "
                     "accepts, a launcher flag, an environment variable, the DeepSpeed JSON, "
                     "derived by the framework from other settings, or none")  # fmt: skip
    name: str = Field("", description="the flag, variable or key")
    evidence: str = Field("", description="why dssup believes the script receives it")
    fix: str = Field("", description="for 'none': what the user can add")
    boolean: bool = Field(
        False, description="the channel only says on/off (recompute levels merge)"
    )

    @property
    def receives(self) -> bool:
        return self.via != "none"

    def render(self, value: Any) -> str:
        """What the script sees for ``value``: two plans that render alike are the same run."""
        if not self.receives:
            return "<not received>"
        if self.boolean:
            return "on" if value not in (None, False, "none", 0) else "off"
        return str(value)

    def line(self) -> str:
        if not self.receives:
            return f"not received: {self.evidence}" + (f"; {self.fix}" if self.fix else "")
        where = {
            "flag": "on the command line, rewritten",
            "framework-flag": "a flag the framework always accepts, set by dssup",
            "launcher-flag": "a launcher option, set by dssup",
            "env": "environment variable",
            "config": "the DeepSpeed JSON dssup rewrites",
            "derived": "derived by the framework",
        }[self.via]
        return f"{self.name} ({where}; {self.evidence})"


@dataclass(frozen=True)
class ScriptSource:
    """The training script's text, when dssup can find and read it (it is never run)."""

    path: Path | None
    text: str
    why: str = ""  # why the text is empty

    def mentions(self, *needles: str) -> str | None:
        """The first needle the source contains (evidence), or None."""
        return next((n for n in needles if n in self.text), None)


def _module_file(name: str, roots: Sequence[str]) -> Path | None:
    parts = name.split(".")
    for root in roots:
        base = Path(root or ".").joinpath(*parts)
        for cand in (base.with_suffix(".py"), base / "__main__.py"):
            if cand.is_file():
                return cand
    return None


def read_source(cmd: LaunchCommand, cwd: Path | None = None) -> ScriptSource:
    """The script's source: its file, or for ``-m`` the module found on the path (searched by
    hand, never imported: importing a package runs its code)."""
    here = cwd or Path.cwd()
    if cmd.no_python:
        return ScriptSource(None, "", "the command runs a program, not a Python script")
    if cmd.module:
        roots = [str(here), *cmd.env.get("PYTHONPATH", "").split(os.pathsep), *sys.path]
        path = _module_file(cmd.script, [r for r in roots if r is not None])
    else:
        path = Path(cmd.script) if Path(cmd.script).is_absolute() else here / cmd.script
    if path is None or not path.is_file():
        return ScriptSource(None, "", f"{cmd.script} was not found from {here}")
    try:
        return ScriptSource(path, path.read_text(errors="replace"))
    except OSError as exc:
        return ScriptSource(path, "", f"{path} cannot be read ({exc.strerror})")


@dataclass(frozen=True)
class Job:
    command: LaunchCommand
    source: ScriptSource

    @property
    def args(self) -> list[str]:
        return self.command.script_args


class Framework(Protocol):
    name: str
    defaults: Mapping[str, int]  # batch settings the framework uses when the command gives none

    def detect(self, job: Job) -> str | None: ...

    def channels(self, job: Job) -> dict[str, Channel]: ...

    def initial(self, job: Job) -> dict[str, Any]: ...

    def render(
        self, plan: TrainingPlan, job: Job, args: list[str], resume: CheckpointRef | None
    ) -> list[str]: ...

    def environment(self, plan: TrainingPlan, job: Job) -> dict[str, str]:
        """Variables besides the ``DSSUP_*`` contract that carry the plan (accelerate's)."""
        ...

    def checkpoint_dir(self, job: Job) -> tuple[Path, str] | None: ...

    def completed(self, job: Job, since: float, output: str) -> Completion | None:
        """Evidence that training finished and whether its final save is whole (``output``:
        rank 0's output of the attempt that began at ``since``), or None."""
        ...

    def reported(self, text: str) -> list[ReportRecord]:
        """``started`` records from the batch figures the framework prints on rank 0."""
        ...


# --- worker-argument helpers shared by the frameworks -----------------------------------------


def _names(name: str | Sequence[str]) -> tuple[str, ...]:
    return (name,) if isinstance(name, str) else tuple(name)


def has_flag(args: Sequence[str], name: str | Sequence[str]) -> str | None:
    """The spelling of the first of ``name`` present in ``args`` (``--x`` or ``--x=v``)."""
    names = _names(name)
    for tok in args:
        flag = tok.partition("=")[0]
        if flag in names:
            return flag
    return None


def flag_value(args: Sequence[str], name: str | Sequence[str]) -> str | None:
    """The value of the last occurrence (argparse keeps the last), '' for a bare switch."""
    names, found = _names(name), None
    for i, tok in enumerate(args):
        flag, sep, inline = tok.partition("=")
        if flag not in names:
            continue
        if sep:
            found = inline
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            found = args[i + 1]
        else:
            found = ""
    return found


def int_flags(args: Sequence[str], flags: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """``{knob: value}`` for each knob whose flag the command passes with a whole number."""
    found = {}
    for knob, names in flags.items():
        raw = flag_value(args, names)
        if raw and raw.isdigit():
            found[knob] = int(raw)
    return found


def set_flag(args: list[str], name: str | Sequence[str], value: str | None) -> list[str]:
    """Every occurrence of the flag set to ``value`` (value None: a bare switch), or appended
    in the first spelling when absent. Other arguments keep their order."""
    names = _names(name)
    out: list[str] = []
    i, seen = 0, False
    while i < len(args):
        tok = args[i]
        flag, sep, _ = tok.partition("=")
        if flag not in names:
            out.append(tok)
            i += 1
            continue
        seen = True
        takes_next = not sep and i + 1 < len(args) and not args[i + 1].startswith("--")
        i += 2 if takes_next else 1
        if value is None:
            out.append(flag)
        elif sep:
            out.append(f"{flag}={value}")
        else:
            out.extend([flag, value])
    if not seen:
        out += [names[0]] if value is None else [names[0], value]
    return out


def drop_flag(args: list[str], name: str | Sequence[str], takes_value: bool) -> list[str]:
    """``args`` without the flag (and its value)."""
    names = _names(name)
    out: list[str] = []
    i = 0
    while i < len(args):
        flag, sep, _ = args[i].partition("=")
        if flag in names:
            nxt = not sep and takes_value and i + 1 < len(args) and not args[i + 1].startswith("--")
            i += 2 if nxt else 1
            continue
        out.append(args[i])
        i += 1
    return out
