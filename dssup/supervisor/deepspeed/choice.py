"""Choosing one DeepSpeed rung by its predicted saving at the failure's phase, and saying why.

Why a module of its own: the choice is the part of the DeepSpeed rung a user reads in the
journal, so it states every candidate's predicted saving, where the prediction came from, and
the rule that picked the winner. The rules, by the context available (``savings``):

* a model description: the peaks are shifted to what the failure showed (bytes in use plus
  the failed request), like the generic planner does; of the candidates predicted to fit the
  device (with the user's margin, none by default: ``dssup.memory.capacity``), the fastest by
  the planner's step time (``dssup.memory.step_time``, the ranking ``dssup plan`` uses) wins,
  its rule saying so when it is within the memory model's uncertainty of the limit; else the
  one with the largest predicted saving;
* the checkpoint's parameter count (optimizer, load and init failures): the free memory at the
  failure was short of the failed request by at most that request, so a candidate saving at
  least the request is predicted to fit; the cheapest such wins, else the largest saving (the
  cheaper on a tie); candidates predicted to save nothing are never picked over one that saves;
* neither: the static cost order for the phase, and the journal says so.

Candidates come in the phase's cost order (``ladder``), which breaks every tie.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dssup.memory.capacity import budget as capacity_budget
from dssup.memory.capacity import near_limit, near_words
from dssup.supervisor.deepspeed.savings import (
    MODEL_STATE_PHASES,
    MemoryContext,
    ParamContext,
    predicted_band,
    predicted_peak,
    predicted_step_time,
    state_bytes,
)
from dssup.supervisor.models import Failure, TrainingPlan

__all__ = ["Choice", "Option", "choose", "size"]


@dataclass(frozen=True)
class Option:
    """One candidate change and the plan it leads to."""

    name: str
    plan: TrainingPlan
    why: str


@dataclass(frozen=True)
class Choice:
    option: Option
    predicted_peak: int | None
    how: str  # the journal's explanation


def size(n: int) -> str:
    """Bytes for the journal: GiB from 1 GiB up, else MiB."""
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def _observed(failure: Failure) -> int | None:
    if failure.in_use_bytes is not None and failure.tried_to_allocate is not None:
        return failure.in_use_bytes + failure.tried_to_allocate
    return None


def _listing(scored: Sequence[tuple[Option, int]], extra: Callable[[int], str]) -> str:
    return ", ".join(f"{o.name} saves {size(s)}{extra(s)}" for o, s in scored)


def _by_model(failure: Failure, plan: TrainingPlan, options: Sequence[Option], mem: MemoryContext) -> Choice | None:  # fmt: skip
    phase = failure.phase
    now = predicted_peak(mem, plan, phase)
    scored = [(o, p) for o in options if (p := predicted_peak(mem, o.plan, phase)) is not None]
    if now is None or not scored:
        return None
    shift = max(0, (_observed(failure) or 0) - now)
    budget = capacity_budget(mem.gpu_memory_bytes, mem.margin)
    savings = [(o, now - p) for o, p in scored]
    lines = _listing(savings, lambda s: f" (peak {size(now + shift - s)})")
    src = f"memory model {mem.model.name}" + (
        f", +{size(shift)} seen in the failure" if shift else ""
    )
    fitting = [(o, p + shift) for o, p in scored if p + shift <= budget]
    if fitting:  # the planner's step time decides (the static order breaks ties)
        times = {o.name: predicted_step_time(mem, o.plan) for o, _ in fitting}
        fitting.sort(key=lambda x: _seconds(times[x[0].name]))
        (o, p), rule = fitting[0], f"the fastest predicted to fit {size(budget)}"
        if times[o.name] is not None:
            rule += f" (planner step time {times[o.name]:.3g} s)"
        band = predicted_band(mem)
        if band is not None and near_limit(p, mem.gpu_memory_bytes, band):
            rule += f"; {near_words(band)}"
    else:
        o, p = min(((o, p + shift) for o, p in scored), key=lambda x: x[1])
        rule = f"nothing predicted to fit {size(budget)}; the largest saving"
    return Choice(o, p, f"predicted savings ({src}): {lines}; {o.name} wins: {rule}")


def _seconds(t: float | None) -> float:
    return float("inf") if t is None else t


def _by_states(failure: Failure, plan: TrainingPlan, options: Sequence[Option], pc: ParamContext) -> Choice:  # fmt: skip
    phase = failure.phase
    now = state_bytes(pc, plan, phase)
    savings = [(o, now - state_bytes(pc, o.plan, phase)) for o in options]
    src = f"model states at the {phase} phase, {pc.source}"
    lines = _listing(savings, lambda s: "")
    need = failure.tried_to_allocate
    useful = [(o, s) for o, s in savings if s > 0]
    covering = [(o, s) for o, s in useful if need is not None and s >= need]
    if covering:
        o, rule = (
            covering[0][0],
            f"the cheapest that saves the whole failed request ({size(need or 0)})",
        )
    elif useful:
        o = max(useful, key=lambda x: x[1])[0]  # max keeps the first (cheaper) on a tie
        rule = "the largest predicted saving"
        rule += f"; none covers the failed request ({size(need)})" if need is not None else ""
    else:
        o, rule = options[0], "none is predicted to save model states; the static order"
    return Choice(o, None, f"predicted savings ({src}): {lines}; {o.name} wins: {rule}")


def choose(
    failure: Failure,
    plan: TrainingPlan,
    options: Sequence[Option],
    mem: MemoryContext | None = None,
    params: ParamContext | None = None,
) -> Choice | None:
    """Pick one of ``options`` (in the phase's cost order) and explain the pick."""
    if not options:
        return None
    if mem is not None and (picked := _by_model(failure, plan, options, mem)) is not None:
        return picked
    if params is not None and failure.phase in MODEL_STATE_PHASES:
        return _by_states(failure, plan, options, params)
    if mem is not None:
        why = "the memory model could not estimate these options"
    elif params is not None:
        why = f"a parameter count predicts no saving of activations ({failure.phase or 'unknown'} phase)"
    else:
        why = "no memory context: no --model and no checkpoint with a parameter count yet"
    names = ", ".join(o.name for o in options)
    phase = failure.phase or "unknown"
    how = f"static order for the {phase} phase ({why}): {names}; {options[0].name} is first"
    return Choice(options[0], None, how)
