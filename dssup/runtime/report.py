"""Tell the supervisor what this attempt really trains with (the job-side report).

A plain training script calls ``report_started`` once it knows its micro-batch, accumulation
and data-parallel size (after resuming, with the step it resumes from), ``report_checkpoint``
after each save and ``report_completed`` at the end (``clean_exit`` and ``mark_done`` do the
last one for it). Hugging Face ``Trainer`` scripts add ``dssup.runtime.hf.DssupCallback``
instead. Under ``dssup run`` the records go to ``$DSSUP_REPORT_FILE``; without dssup every
helper does nothing, so the same script runs both ways. The format is ``dssup.jobreport``.

Only the standard library and pydantic are imported here: reporting never costs a torch import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dssup.jobreport import (
    ENV_VAR,
    BatchChanged,
    CheckpointSaved,
    Completed,
    ReportRecord,
    Started,
    append_record,
)
from dssup.runtime.plan import env_knobs_read

__all__ = [
    "report_batch_changed",
    "report_checkpoint",
    "report_completed",
    "report_record",
    "report_started",
    "who",
]


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key, "").strip()
    return int(raw) if raw.isdigit() else None


def who(env: Mapping[str, str] | None = None) -> dict[str, int | None]:
    """The writer fields of a record (attempt, rank, local rank) from the environment."""
    env = _env(env)
    return {
        "attempt": _int(env, "DSSUP_ATTEMPT"),
        "rank": _int(env, "RANK") or 0,
        "local_rank": _int(env, "LOCAL_RANK"),
    }


def report_record(record: ReportRecord, env: Mapping[str, str] | None = None) -> bool:
    """Append ``record`` to this attempt's report; False (and nothing written) without dssup."""
    path = _env(env).get(ENV_VAR, "")
    if not path:
        return False
    append_record(path, record)
    return True


def report_started(
    *,
    micro_batch: int,
    grad_accum: int,
    dp: int | None = None,
    world_size: int | None = None,
    global_batch: int | None = None,
    first_step: int | None = 0,
    resumed_from: str | os.PathLike[str] | None = None,
    recompute: str | None = None,
    framework: str = "plain",
    source: str = "dssup.runtime.report_started",
    env: Mapping[str, str] | None = None,
) -> Started | None:
    """Record what this rank trains with. ``global_batch`` defaults to micro x accumulation x
    DP; pass the figure your loop really uses when it has its own (a mismatch is then seen).
    World and DP size default to ``WORLD_SIZE``. Returns the record, or None without dssup."""
    e = _env(env)
    world = world_size or _int(e, "WORLD_SIZE") or 1
    data_parallel = dp or world
    record = Started(
        **who(e),
        source=source,
        world_size=world,
        dp=data_parallel,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        global_batch=global_batch or micro_batch * grad_accum * data_parallel,
        first_step=first_step,
        resumed_from=os.fspath(resumed_from) if resumed_from else None,
        recompute=recompute,
        framework=framework,
        env_knobs=env_knobs_read(),
    )
    return record if report_record(record, e) else None


def report_checkpoint(
    step: int,
    path: str | os.PathLike[str] = "",
    *,
    source: str = "dssup.runtime.report_checkpoint",
    env: Mapping[str, str] | None = None,
) -> bool:
    """Record that the step-``step`` checkpoint is completely written (call it after the save)."""
    e = _env(env)
    record = CheckpointSaved(**who(e), source=source, step=step, path=os.fspath(path))
    return report_record(record, e)


def report_batch_changed(
    *,
    step: int,
    micro_batch: int,
    grad_accum: int,
    dp: int,
    global_batch: int | None = None,
    reason: str = "",
    source: str = "dssup.runtime.report_batch_changed",
    env: Mapping[str, str] | None = None,
) -> bool:
    """Record an in-process change of the micro-batch split (the global batch must not move)."""
    e = _env(env)
    record = BatchChanged(
        **who(e),
        source=source,
        step=step,
        dp=dp,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        global_batch=global_batch or micro_batch * grad_accum * dp,
        reason=reason,
    )
    return report_record(record, e)


def report_completed(
    step: int | None = None,
    *,
    source: str = "dssup.runtime.report_completed",
    final: bool = True,
    env: Mapping[str, str] | None = None,
) -> bool:
    """Record that training finished on this rank. ``final`` (the default): the script's work,
    its final save included, is done, so a failure after it is only teardown; ``final=False``
    where the script still saves after this (a Trainer's ``on_train_end``)."""
    e = _env(env)
    return report_record(Completed(**who(e), source=source, step=step, final=final), e)
