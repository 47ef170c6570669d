"""Agreeing on generation ``g``: the leader decides once, everyone else waits for that record.

The leader (lowest live node rank) gathers the nodes waiting for ``g``: it waits for nodes
still finishing the previous generation (until their heartbeat goes stale), and for up to
``settle_s`` for more nodes while fewer than MAX are there; it then takes the largest node count
that keeps the global batch exact, re-plans for that world size, and publishes the decision with
an exclusive create. Followers poll for the record and never launch without it; when the
leader dies while they wait, the next lowest live node takes over (and the exclusive create
makes a race between two would-be leaders harmless).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dssup.elastic import ElasticRequest, NodeRange, solve
from dssup.supervisor.models import TrainingPlan
from dssup.supervisor.multinode.config import MultiNodeConfig
from dssup.supervisor.multinode.membership import Membership
from dssup.supervisor.multinode.records import Decision, decision_key
from dssup.supervisor.multinode.store import SharedStore

__all__ = ["Agreement", "Proposal", "usable_nodes"]

log = logging.getLogger(__name__)


def usable_nodes(count: int, cfg: MultiNodeConfig, plan: TrainingPlan) -> int | None:
    """Largest node count <= ``count`` within MIN:MAX that keeps the global batch exact."""
    high = min(count, cfg.nodes.max_nodes)
    if high < cfg.nodes.min_nodes:
        return None
    if plan.global_batch is None:
        return high
    req = ElasticRequest(
        global_batch=plan.global_batch,
        nodes=NodeRange(min_nodes=cfg.nodes.min_nodes, max_nodes=high),
        nproc_per_node=cfg.nproc_per_node,
        model_parallel=max(1, plan.world_size // plan.dp),
    )
    ok = solve(req).compatible_nnodes
    return max(ok) if ok else None


@dataclass
class Proposal:
    """What the leader's caller turns into a decision: the node set for this generation."""

    generation: int
    nodes: tuple[int, ...]


@dataclass
class Agreement:
    cfg: MultiNodeConfig
    store: SharedStore
    members: Membership
    plan_of: Callable[[], TrainingPlan]  # the plan the next generation starts from
    decide: Callable[[Proposal], Decision]  # leader: re-plan for the node set
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    _gather_started: dict[int, float] = field(default_factory=dict)

    def latest(self) -> int:
        keys = self.store.keys("generations/")
        return int(keys[-1].rsplit("g", 1)[-1]) if keys else 0

    def wait_for(self, generation: int) -> Decision | None:
        """Generation ``generation``'s decision (made here if we lead); None on timeout."""
        self.members.set("waiting", generation)
        deadline = self.clock() + self.cfg.decision_timeout_s
        while True:
            doc = self.store.get(decision_key(generation))
            if doc is not None:
                return Decision.model_validate(doc)
            if self.members.leader() == self.cfg.node_rank:
                proposal = self._gather(generation)
                if proposal is not None:
                    decision = self.decide(proposal)
                    won, doc = self.store.publish(
                        decision_key(generation), decision.model_dump(mode="json")
                    )
                    log.info("generation %s: %s (%s)", generation, decision.reason, won)
                    return Decision.model_validate(doc)
            if self.clock() >= deadline:
                return None
            self.sleep(self.cfg.poll_s)

    def _gather(self, generation: int) -> Proposal | None:
        """The node set once it is settled; None while it is still forming."""
        now = self.clock()
        started = self._gather_started.setdefault(generation, now)
        live = self.members.live()
        waiting = [m.node for m in live if m.state == "waiting" and m.generation >= generation]
        busy = [m.node for m in live if m.node not in waiting]
        if busy:
            return None  # still running or reporting; a dead node drops out when it goes stale
        if len(waiting) < self.cfg.nodes.max_nodes and now - started < self.cfg.settle_s:
            return None  # give late nodes a moment to join
        count = usable_nodes(len(waiting), self.cfg, self.plan_of())
        if count is None:
            return None
        return Proposal(generation, tuple(sorted(waiting)[:count]))
