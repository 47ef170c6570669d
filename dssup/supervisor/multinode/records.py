"""What the nodes write to the shared directory: members, generation decisions, node reports.

Frozen pydantic records, JSON on disk, so that every node (and a person with ``cat``) reads the
same facts. A *generation* is one synchronized torchrun launch on every participating node;
its decision names the nodes, the world size, the plan and the generation-scoped rendezvous id,
and is written exactly once (``SharedStore.publish``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.supervisor.models import Failure, TrainingPlan

__all__ = ["Decision", "Member", "NodeReport", "decision_key", "preempt_key", "report_key"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
MemberState = Literal["waiting", "running", "reporting", "ended"]


def decision_key(generation: int) -> str:
    return f"generations/g{generation:06d}"


def preempt_key(generation: int) -> str:
    return f"preempt/g{generation:06d}"


def report_key(generation: int, node: int) -> str:
    return f"reports/g{generation:06d}/node-{node:04d}"


class Member(BaseModel):
    """A node's heartbeat: rewritten every ``heartbeat_s`` and at every state change."""

    model_config = _FROZEN
    node: int = Field(description="node rank (PET_NODE_RANK / --node-rank)")
    host: str = Field(description="hostname, for people")
    pid: int = Field(description="the node's dssup process id")
    ts: float = Field(description="wall-clock time of the heartbeat, seconds since the epoch")
    state: MemberState = Field(description="what the node is doing")
    generation: int = Field(description="generation it runs, reports on, or waits for")


class Decision(BaseModel):
    """Generation ``generation``: who runs, at which world size, with which plan."""

    model_config = _FROZEN
    generation: int = Field(ge=1)
    action: Literal["run", "end"] = Field(description="launch, or stop every node")
    leader: int = Field(description="node rank that made the decision")
    nodes: tuple[int, ...] = Field((), description="node ranks taking part")
    nproc_per_node: int = Field(1, ge=1, description="ranks per node")
    world_size: int = Field(0, ge=0, description="nodes x nproc_per_node")
    plan: TrainingPlan | None = Field(None, description="the plan every node launches with")
    rdzv_id: str = Field("", description="generation-scoped torchrun --rdzv-id")
    reason: str = Field("", description="why this plan / why the end")
    cause: Failure | None = Field(None, description="agreed root cause of the last generation")
    outcome: str = Field("", description="for action=end: succeeded, gave-up, ...")
    exit_code: int | None = Field(None, description="for action=end: the run's exit status")
    created: float = Field(description="wall-clock time of the decision")


class NodeReport(BaseModel):
    """One node's view of how a generation ended on it."""

    model_config = _FROZEN
    node: int
    generation: int
    exit_code: int | None = Field(description="torchrun's exit status on this node")
    failure: Failure | None = Field(description="this node's own classification")
    group_rank: int | None = Field(None, description="torchrun's group_rank, from its log")
    group_world_size: int | None = Field(None, description="nodes torchrun actually grouped")
    checkpoint_step: int | None = Field(None, description="latest complete checkpoint seen")
    preempted: bool = Field(False, description="stopped on purpose (a node joined)")
    ts: float = Field(description="wall-clock time of the report")
