"""Can the next attempt load this checkpoint as it is, or must it be converted first?

Pure decision table, from what was measured with DeepSpeed 0.19.8 on CPU (see
``../shared/notes/cpu-feasibility.md`` and tests/integration/deepspeed):

* a new micro-batch / accumulation at the same stage and data-parallel size loads directly;
* stage 1 ↔ 2 at the same data-parallel size loads directly (same file layout);
* at stage 0 the data-parallel size may change (every rank holds everything);
* any change of stage involving 0 or 3, and any change of data-parallel size at stages 1-3,
  fails natively (``ZeRORuntimeException`` or missing files): convert to a universal
  checkpoint and load it with ``checkpoint.load_universal`` for one attempt;
* nothing loads a universal checkpoint into a stage-0 engine (it has no ZeRO optimizer to take
  the per-parameter state): the only way down to stage 0 is the fp32 fallback.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.supervisor.deepspeed.ckpt_info import CheckpointInfo

__all__ = ["LoadPath", "decide_load"]

LoadKind = Literal["direct", "universal", "fp32-fallback", "none"]


class LoadPath(BaseModel):
    """How the next attempt should resume, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: LoadKind = Field(description="direct load, convert to universal, fp32 weights only, none")
    reason: str = Field(description="one sentence for the journal")
    keeps_optimizer: bool = Field(description="Adam moments and step survive the resume")


def decide_load(info: CheckpointInfo | None, stage: int, dp: int) -> LoadPath:
    """The load path for a checkpoint saved as ``info`` into an engine at ``stage``/``dp``."""
    if info is None:
        return LoadPath(kind="none", reason="no checkpoint to resume from", keeps_optimizer=False)
    if not info.complete:
        return LoadPath(
            kind="none",
            reason=f"checkpoint {info.tag} is partial (missing {', '.join(info.missing[:3])})",
            keeps_optimizer=False,
        )
    was = f"saved at ZeRO-{info.zero_stage}, DP {info.dp_world_size}"
    now = f"next attempt runs ZeRO-{stage}, DP {dp}"
    if info.universal:
        if stage == 0:
            return _fallback(f"{was} as a universal checkpoint; {now}, which cannot load one")
        return LoadPath(kind="universal", reason=f"already universal; {now}", keeps_optimizer=True)
    if _direct_ok(info.zero_stage, info.dp_world_size, stage, dp):
        return LoadPath(kind="direct", reason=f"{was}; {now}: loads natively", keeps_optimizer=True)
    if stage == 0:
        return _fallback(f"{was}; {now}: a stage-0 engine cannot load ZeRO or universal state")
    return LoadPath(
        kind="universal",
        reason=f"{was}; {now}: native load fails, convert once with ds_to_universal",
        keeps_optimizer=True,
    )


def _direct_ok(src_stage: int, src_dp: int, stage: int, dp: int) -> bool:
    if src_stage == 0 and stage == 0:
        return True
    if src_dp != dp:
        return False
    return src_stage == stage or {src_stage, stage} == {1, 2}


def _fallback(reason: str) -> LoadPath:
    return LoadPath(
        kind="fp32-fallback",
        reason=f"{reason}; resuming from fp32 weights with a FRESH optimizer",
        keeps_optimizer=False,
    )
