"""The supervisor's data: plans, failures and remedies as frozen records, never exceptions.

A failed attempt is normal operation for ``dssup run``: it becomes a ``Failure`` (what broke,
where, the evidence), the planner turns it into a ``Remedy`` (a new ``TrainingPlan`` and why),
and both go into the journal as JSON. Keeping them as plain pydantic models lets the journal
replay a run after the supervisor itself was killed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Failure", "FailureKind", "RankFailure", "Remedy", "TrainingPlan"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class FailureKind(StrEnum):
    """Why an attempt ended. The value is a stable slug (journal, metrics labels, logs)."""

    CUDA_OOM = "cuda-oom"  # torch.OutOfMemoryError / CUDA error: out of memory / cuBLAS alloc
    HOST_OOM = "host-oom"  # CPU allocator failure, or SIGKILL with OOM-killer evidence
    LOAD_OOM = "load-oom"  # any OOM while a checkpoint was being loaded
    COMM_OOM = "comm-oom"  # OOM inside a collective (NCCL/gloo buffers)
    COMM = "comm"  # a communication failure that is the root cause (not a cascade)
    USER_ERROR = "user-error"  # SyntaxError, FileNotFoundError, shape mismatch: never retried
    TRANSIENT = "transient"  # unknown; retried with backoff, bounded
    TEARDOWN = "teardown"  # a worker aborted after the job reported completion: success
    # training finished, then a worker failed before the script's final save was seen whole:
    # not retried (it would train again), and not a success
    UNVERIFIED_END = "unverified-end"
    BATCH_MISMATCH = "batch-mismatch"  # the job reported a global batch other than the plan's
    INTERRUPTED = "interrupted"  # dssup was told to stop, or was killed mid-attempt

    @property
    def is_oom(self) -> bool:
        return self in _OOM_KINDS


_OOM_KINDS = frozenset(
    {FailureKind.CUDA_OOM, FailureKind.HOST_OOM, FailureKind.LOAD_OOM, FailureKind.COMM_OOM}
)


class RankFailure(BaseModel):
    """One failed worker, as reconstructed from every source about it."""

    model_config = _FROZEN
    rank: int | None = Field(None, description="global rank; None when unknown")
    local_rank: int | None = Field(None, description="rank on this node")
    exit_code: int | None = Field(None, description="negative: killed by that signal number")
    message: str = Field("", description="one-line error (error file, else stderr tail)")
    timestamp: int | None = Field(None, description="error-file timestamp, epoch seconds")
    kind: FailureKind = FailureKind.TRANSIENT
    cascade: bool = Field(False, description="a consequence of another rank's failure")
    signature: str = Field("", description="name of the pattern that matched")
    phase: str = Field("", description="load, forward, backward, optimizer, comm, or ''")
    sources: tuple[str, ...] = Field((), description="error-file, stderr, exit-code, ...")


class Failure(BaseModel):
    """The verdict on one attempt: the root cause and what supports it."""

    model_config = _FROZEN
    kind: FailureKind
    rank: int | None = Field(None, description="rank of the root cause")
    exit_code: int | None = Field(None, description="torchrun's exit status")
    signal: int | None = Field(None, description="signal that killed the root-cause worker")
    message: str = ""
    signature: str = ""
    phase: str = ""
    tried_to_allocate: int | None = Field(None, description="bytes the failed allocation asked")
    free_bytes: int | None = Field(None, description="bytes free on the device at the failure")
    total_bytes: int | None = Field(None, description="device capacity reported, bytes")
    reserved_unallocated: int | None = Field(None, description="cached but unused bytes")
    in_use_bytes: int | None = Field(None, description="bytes the process held at the failure")
    ranks: tuple[RankFailure, ...] = ()
    evidence: tuple[str, ...] = Field((), description="human-readable facts behind the verdict")

    @property
    def retryable(self) -> bool:
        return self.kind not in {
            FailureKind.USER_ERROR,
            FailureKind.TEARDOWN,
            FailureKind.UNVERIFIED_END,
            FailureKind.BATCH_MISMATCH,
        }


class TrainingPlan(BaseModel):
    """The memory-relevant settings of one attempt. ``global_batch`` never changes."""

    model_config = _FROZEN
    micro_batch: int | None = Field(None, ge=1, description="sequences per micro-batch per rank")
    grad_accum: int | None = Field(None, ge=1, description="micro-batches per optimizer step")
    global_batch: int | None = Field(None, ge=1, description="sequences per optimizer step")
    dp: int = Field(1, ge=1, description="data-parallel ranks")
    world_size: int = Field(1, ge=1, description="all ranks (torchrun nnodes x nproc)")
    recompute: str = Field("none", description="activation recompute: none, selective, full")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage")
    offload: str = Field("none", description="none, optimizer, optimizer+params")
    expandable_segments: bool = Field(False, description="PYTORCH_CUDA_ALLOC_CONF setting")
    load_to_cpu: bool = Field(False, description="load checkpoints with map_location='cpu'")
    extra: dict[str, Any] = Field(default_factory=dict, description="adapter-owned settings")

    def key(self) -> str:
        """Identity for 'never repeat a config that already failed'."""
        return self.model_dump_json(exclude={"world_size"})

    def changes_from(self, other: TrainingPlan) -> dict[str, tuple[Any, Any]]:
        """Fields that differ: ``{name: (before, after)}``."""
        mine, theirs = self.model_dump(), other.model_dump()
        return {k: (theirs[k], mine[k]) for k in mine if mine[k] != theirs[k]}

    def describe(self) -> str:
        parts = [f"micro-batch {self.micro_batch}", f"accumulation {self.grad_accum}"]
        parts.append(f"global batch {self.global_batch}")
        if self.recompute != "none":
            parts.append(f"recompute {self.recompute}")
        if self.zero_stage:
            parts.append(f"ZeRO-{self.zero_stage}")
        if self.offload != "none":
            parts.append(f"offload {self.offload}")
        if self.expandable_segments:
            parts.append("expandable segments")
        return ", ".join(parts)


class Remedy(BaseModel):
    """A proposed change: the new plan, which rung of the ladder, and why it should fit."""

    model_config = _FROZEN
    step: str = Field(description="ladder rung: alloc-conf, halve-micro-batch, recompute, ...")
    plan: TrainingPlan
    reason: str
    predicted_peak_bytes: int | None = None
    calibration_bytes: int | None = None
