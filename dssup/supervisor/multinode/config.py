"""Settings of multi-node agreement: every timeout with its unit and the reason for its default.

Defaults are deliberately long. Rendezvous timeouts set much shorter than 2 s keep-alive / 5 s
last call were seen to split one job into two groups writing one checkpoint; dssup's own
timeouts only decide when a silent node counts as gone, so erring long costs seconds, erring
short costs a split brain.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dssup.elastic import NodeRange
from dssup.errors import ConfigError

__all__ = ["MultiNodeConfig"]


class MultiNodeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    shared_dir: Path = Field(description="directory every node sees (next to the checkpoints)")
    node_rank: int = Field(ge=0, description="this node's rank; the lowest live rank leads")
    nodes: NodeRange = Field(description="torchrun --nnodes MIN:MAX")
    nproc_per_node: int = Field(1, ge=1, description="ranks per node")
    run_name: str = Field(description="prefix of every generation's --rdzv-id")
    heartbeat_s: float = Field(2.0, gt=0, description="heartbeat period, seconds")
    member_timeout_s: float = Field(
        20.0, gt=0, description="a node silent this long is gone, seconds (>= 3 heartbeats)"
    )
    decision_timeout_s: float = Field(
        900.0, gt=0, description="longest wait for a generation decision, seconds"
    )
    report_timeout_s: float = Field(
        180.0, gt=0, description="longest wait for the other nodes' reports, seconds"
    )
    settle_s: float = Field(
        5.0, ge=0, description="how long the leader waits for more nodes (up to MAX), seconds"
    )
    poll_s: float = Field(0.25, gt=0, description="shared-directory polling period, seconds")
    kubernetes_events: bool = Field(
        True, description="publish decisions as Events/annotations when in a pod (fails soft)"
    )

    @model_validator(mode="after")
    def _timeouts(self) -> MultiNodeConfig:
        if self.member_timeout_s < 3 * self.heartbeat_s:
            raise ConfigError(
                "member_timeout_s",
                f"{self.member_timeout_s} s is under three heartbeats of {self.heartbeat_s} s",
                "a node must miss several heartbeats before it counts as gone",
            )
        return self
