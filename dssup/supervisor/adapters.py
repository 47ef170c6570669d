"""Extension points: framework adapters and extra rungs of the remedy ladder.

The supervisor itself knows torchrun, the ``DSSUP_*`` environment and a few well-known batch
flags. A framework adapter (DeepSpeed lives in ``dssup.supervisor.deepspeed``) adds what only it
knows, through one small protocol:

* ``initial_plan``: read batch/ZeRO/offload settings from the command (a DeepSpeed JSON);
* ``capabilities``: which plan fields it can change (``zero_stage``, ``offload``); the planner
  only proposes changes that some adapter (or the environment contract) can carry out;
* ``remedy_steps``: extra ladder rungs (raise ZeRO stage, offload optimizer, ...), tried after
  the built-in ones in the order given;
* ``apply``: rewrite the command and environment for an attempt (write a new DeepSpeed JSON
  under the attempt directory, point the command at it);
* ``checkpoint_dirs``: where this framework saves checkpoints, found in the command;
* ``applies`` (optional): whether the command is a job of this framework at all. Adapters
  that do not apply take no part in the run (no rungs, no capabilities). Without the method,
  an adapter applies when its ``initial_plan`` fills in a blank plan from the command;
* ``assess`` (optional): judge an attempt once it has ended (DeepSpeed: did the loss continue
  after a resume under a changed config?). The supervisor journals each record as
  ``continuity``; a record with ``ok: false`` makes the recovery a failure, even when training
  then finishes.

``load_adapters`` finds the DeepSpeed adapter by importing ``dssup.supervisor.deepspeed`` and
calling its ``adapter()`` factory when that exists, so this package never depends on it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from dssup.supervisor.command import LaunchCommand
from dssup.supervisor.models import Failure, Remedy, TrainingPlan

__all__ = [
    "AppliedPlan",
    "Objection",
    "PlanAdapter",
    "RemedyContext",
    "RemedyStep",
    "adapter_applies",
    "assessments",
    "load_adapters",
]

log = logging.getLogger(__name__)

BUILTIN_CAPABILITIES = frozenset(
    {"micro_batch", "grad_accum", "recompute", "expandable_segments", "load_to_cpu"}
)


@dataclass(frozen=True)
class Objection:
    """Why a proposed plan is not used. ``unreachable``: a knob it changes cannot reach the
    script (every further proposal of the same rung would fail alike)."""

    reason: str
    unreachable: bool = False


@dataclass(frozen=True)
class RemedyContext:
    """What a ladder rung may look at besides the failure and the current plan."""

    tried: frozenset[str]  # TrainingPlan.key() of every config that already failed
    capabilities: frozenset[str]
    device: str = "cuda"  # "cpu" when tensors live on the CPU (gloo jobs)
    # Why a proposed plan cannot be used for this script (a knob it cannot receive, or the
    # same effective run as one that failed), or None: the hand-off's judgement.
    check: Callable[[TrainingPlan], Objection | None] | None = None
    progress_saved: bool = True  # False before the job's first complete checkpoint

    def usable(self, plan: TrainingPlan) -> bool:
        """Not tried, and the hand-off has no objection."""
        return plan.key() not in self.tried and (self.check is None or self.check(plan) is None)


@runtime_checkable
class RemedyStep(Protocol):
    """One rung of the ladder. ``propose`` returns None when it has nothing to offer."""

    name: str

    def propose(self, failure: Failure, plan: TrainingPlan, ctx: RemedyContext) -> Remedy | None:
        """A new plan that should avoid ``failure``, never one whose key is in ``ctx.tried``."""
        ...


@dataclass
class AppliedPlan:
    """An adapter's changes for one attempt."""

    script_args: list[str] | None = None  # replaces the worker arguments when set
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # journalled, e.g. "wrote ds_config.json"


class PlanAdapter(Protocol):
    name: str
    capabilities: frozenset[str]

    def initial_plan(self, command: LaunchCommand, plan: TrainingPlan) -> TrainingPlan:
        """Fill in what the command says (batch triple, ZeRO stage); return ``plan`` if nothing."""
        ...

    def remedy_steps(self) -> Sequence[RemedyStep]: ...

    def apply(
        self,
        plan: TrainingPlan,
        command: LaunchCommand,
        script_args: list[str],
        attempt_dir: Path,
    ) -> AppliedPlan: ...

    def checkpoint_dirs(self, command: LaunchCommand) -> list[Path]: ...


def adapter_applies(adapter: PlanAdapter, command: LaunchCommand, plan: TrainingPlan) -> bool:
    """``adapter.applies(command)`` when defined, else: its ``initial_plan`` finds settings in the
    command (``plan`` should be blank: batch fields unset, so anything found changes it)."""
    check = getattr(adapter, "applies", None)
    if callable(check):
        return bool(check(command))
    return adapter.initial_plan(command, plan) != plan


def assessments(adapters: Sequence[PlanAdapter], attempt_dir: Path) -> list[dict[str, Any]]:
    """What the adapters with an ``assess`` method say about the attempt in ``attempt_dir``:
    JSON-ready records, each with the adapter's name and an ``ok`` flag. An adapter that fails
    while judging is logged and skipped; judging never stops a run."""
    out: list[dict[str, Any]] = []
    for adapter in adapters:
        assess = getattr(adapter, "assess", None)
        if not callable(assess):
            continue
        try:
            record = assess(attempt_dir)
        except Exception:
            log.exception("adapter %s could not judge %s", adapter.name, attempt_dir.name)
            continue
        if record is not None:
            out.append({"adapter": adapter.name, **record})
    return out


def load_adapters(names: Sequence[str] = ("dssup.supervisor.deepspeed",)) -> list[PlanAdapter]:
    """Adapters whose package exposes ``adapter() -> PlanAdapter`` (absent ones are skipped)."""
    found: list[PlanAdapter] = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            log.debug("adapter %s not available: %s", name, exc)
            continue
        factory = getattr(module, "adapter", None)
        if callable(factory):
            found.append(factory())
    return found
