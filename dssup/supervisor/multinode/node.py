"""One node's supervisor in a multi-node job: same loop, agreed generations, merged verdicts.

``MultiNodeSupervisor`` is the single-node ``Supervisor`` with three differences:

* before every launch it takes part in the agreement for the next *generation* (``agree.py``):
  the node set, world size and plan come from the one published decision, and torchrun runs
  with ``--nnodes`` fixed to that set and a generation-scoped ``--rdzv-id``;
* after every launch it publishes its own verdict and waits for the other nodes' (or for their
  heartbeats to stop); the run-level root cause is merged from all of them (``rootcause.py``),
  so a peer's cascade never drives a remedy, and only the leader runs the remedy ladder;
* membership changes are not faults: a lost node, a node that joined (the running generation
  is stopped on purpose, and resumes bigger from the checkpoint) or a split brain re-plan the
  next generation for the new world size with ``dssup.elastic`` (global batch exact, memory
  raised pre-emptively when the memory model says the smaller world would not fit).

The attempt body mirrors ``Supervisor._attempt`` (launch, classify, journal; the preparation
is shared: ``AttemptCycle._prepare``) with the merge placed before the journal entry; the
supervisor exposes no hook there yet.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from typing import Any

from dssup.supervisor.aftermath import rank0_output
from dssup.supervisor.attempt import AttemptResult, run_attempt
from dssup.supervisor.command import LaunchCommand
from dssup.supervisor.jobview import JobView
from dssup.supervisor.journal import Journal
from dssup.supervisor.models import Failure, FailureKind, TrainingPlan
from dssup.supervisor.multinode.agree import Agreement, Proposal, usable_nodes
from dssup.supervisor.multinode.config import MultiNodeConfig
from dssup.supervisor.multinode.kube import EventPublisher
from dssup.supervisor.multinode.launch import generation_command, read_group
from dssup.supervisor.multinode.membership import Membership
from dssup.supervisor.multinode.records import (
    Decision,
    NodeReport,
    decision_key,
    preempt_key,
    report_key,
)
from dssup.supervisor.multinode.rescale import memory_context, rescale_plan
from dssup.supervisor.multinode.rootcause import MEMBERSHIP_SIGNATURES, merge
from dssup.supervisor.multinode.splitbrain import quarantine_since
from dssup.supervisor.multinode.store import SharedStore
from dssup.supervisor.state import RunState
from dssup.supervisor.supervisor import RunOutcome, Supervisor
from dssup.supervisor.text import clip

__all__ = ["MultiNodeSupervisor"]

log = logging.getLogger(__name__)


class _Ended(Exception):
    def __init__(self, decision: Decision, state: RunState) -> None:
        super().__init__(decision.reason)
        self.decision, self.state = decision, state


class MultiNodeSupervisor(Supervisor):
    mn: MultiNodeConfig
    store: SharedStore
    members: Membership
    agreement: Agreement
    events: EventPublisher
    base_command: LaunchCommand
    generation: int
    decision: Decision | None
    preempted: bool
    _state: RunState | None
    _cause: Failure | None

    @classmethod
    def wrap(cls, sup: Supervisor, mn: MultiNodeConfig) -> MultiNodeSupervisor:
        """The multi-node version of an already configured single-node supervisor."""
        kwargs = {f.name: getattr(sup, f.name) for f in dataclasses.fields(sup) if f.init}
        self = cls(**kwargs)
        self.mn = mn
        self.store = SharedStore(mn.shared_dir)
        self.members = Membership(self.store, mn.node_rank, mn.heartbeat_s, mn.member_timeout_s)
        self.agreement = Agreement(mn, self.store, self.members, self._plan, self._decide)
        self.events = EventPublisher(enabled=mn.kubernetes_events)
        self.base_command = self.command
        self.generation = 0
        self.decision = None
        self.preempted = False
        self._state = None
        self._cause = None
        return self

    # --- lifecycle -----------------------------------------------------------------------
    def run(self) -> RunOutcome:
        self.generation = self._last_generation(Journal(self.config.run_dir))
        self.members.on_beat.append(self._watch)
        self.members.start()
        try:
            return super().run()
        finally:
            self.members.stop("ended")

    def _last_generation(self, journal: Journal) -> int:
        last = journal.last("generation")
        return int(last["generation"]) if last else 0

    def _loop(self, journal: Journal) -> RunOutcome:
        try:
            return super()._loop(journal)
        except _Ended as end:
            d = end.decision
            code = d.exit_code if d.exit_code is not None else 125
            journal.append("generation-ended", generation=d.generation, leader=d.leader,
                           outcome=d.outcome, reason=d.reason)  # fmt: skip
            return Supervisor._end(self, journal, end.state, d.outcome or "gave-up", d.reason, code)

    def _end(
        self, journal: Journal, state: RunState, outcome: str, reason: str, code: int | None = None
    ) -> RunOutcome:
        out = super()._end(journal, state, outcome, reason, code)
        end = Decision(
            generation=self.generation + 1, action="end", leader=self.mn.node_rank,
            outcome=outcome, reason=f"node {self.mn.node_rank}: {reason}", exit_code=out.exit_code,
            cause=self._cause, created=time.time(),
        )  # fmt: skip
        won, _ = self.store.publish(decision_key(end.generation), end.model_dump(mode="json"))
        if won:
            self.events.publish("RunEnded", end.reason, {"dssup.io/outcome": outcome})
        return out

    # --- agreement -----------------------------------------------------------------------
    def _plan(self) -> TrainingPlan:
        """The plan the next generation starts from: ours, or the newest published one when
        generations ran without us (a node that joins late must not restart from scratch)."""
        latest = self.agreement.latest()
        for g in range(latest, self.generation, -1):
            doc = self.store.get(decision_key(g))
            if doc and doc.get("action") == "run":
                return Decision.model_validate(doc).plan or self.config.initial_plan
        return self._state.plan if self._state else self.config.initial_plan

    def _decide(self, p: Proposal) -> Decision:
        """Leader only: the plan for the proposed node set (re-planned when the world moved)."""
        state = self._state
        plan = self._plan()
        world = len(p.nodes) * self.mn.nproc_per_node
        reason = f"{len(p.nodes)} node(s) {list(p.nodes)}: {plan.describe()}"
        if world != plan.world_size:
            caps = self._capabilities()
            memory = memory_context(self.planner, caps)
            tried = state.tried if state else set()
            plan, verdict = rescale_plan(plan, self.config.initial_plan, world, memory, tried)
            if verdict is not None:
                reason = f"world {world}: {verdict.action}: {verdict.reason}"
        return Decision(
            generation=p.generation, action="run", leader=self.mn.node_rank, nodes=p.nodes,
            nproc_per_node=self.mn.nproc_per_node, world_size=world, plan=plan,
            rdzv_id=f"{self.mn.run_name}-g{p.generation}", reason=reason, cause=self._cause,
            created=time.time(),
        )  # fmt: skip

    def _capabilities(self) -> frozenset[str]:
        from dssup.supervisor.adapters import BUILTIN_CAPABILITIES

        return frozenset(BUILTIN_CAPABILITIES | {c for a in self.adapters for c in a.capabilities})

    def _join(self, state: RunState) -> Decision:
        """The next generation this node takes part in (waiting out those it is left out of)."""
        latest = self.agreement.latest()
        if not self.generation and latest:
            doc = self.store.get(decision_key(latest))
            if doc is not None and doc.get("action") == "end":
                raise _Ended(Decision.model_validate(doc), state)  # the run is already over
        g = self.generation + 1 if self.generation else latest + 1
        while True:
            d = self.agreement.wait_for(g)
            if d is None:
                timeout = Decision(
                    generation=g, action="end", leader=self.mn.node_rank, outcome="gave-up",
                    reason=f"no decision for generation {g} within "
                    f"{self.mn.decision_timeout_s:.0f} s", exit_code=125, created=time.time(),
                )  # fmt: skip
                raise _Ended(timeout, state)
            if d.action == "end":
                raise _Ended(d, state)
            if self.mn.node_rank in d.nodes:
                return d
            log.info("generation %s runs without node %s; waiting", g, self.mn.node_rank)
            g += 1

    # --- membership watch (heartbeat thread) ---------------------------------------------
    def _watch(self) -> None:
        d = self.decision
        if d is None or self.preempted or self.members.state != "running":
            return
        if self.store.get(preempt_key(d.generation)) is not None:
            self.preempted = True
            return
        running = [m.node for m in self.members.live() if m.node in d.nodes]
        if not running or running[0] != self.mn.node_rank:
            return  # the lowest live node of the running generation decides to stop it
        joiners = [m.node for m in self.members.live() if m.node not in d.nodes]
        joiners = [n for n in joiners if self._waiting_for_later(n, d.generation)]
        if not joiners or d.plan is None:
            return
        count = usable_nodes(len(d.nodes) + len(joiners), self.mn, d.plan)
        if count is not None and count > len(d.nodes):
            doc = {"generation": d.generation, "joined": joiners, "ts": time.time()}
            self.store.publish(preempt_key(d.generation), doc)
            self.preempted = True

    def _waiting_for_later(self, node: int, generation: int) -> bool:
        return any(
            m.node == node and m.state == "waiting" and m.generation > generation
            for m in self.members.live()
        )

    # --- one generation ------------------------------------------------------------------
    def _attempt(self, journal: Journal, state: RunState) -> AttemptResult:
        """One generation; membership changes roll straight into the next one (they are not
        failures of the job: no backoff, no remedy, no transient budget used)."""
        while True:
            result = self._generation(journal, state)
            failure = result.failure
            if failure is None or failure.signature not in MEMBERSHIP_SIGNATURES:
                return result
            if self._signal is not None or state.attempts >= self.config.max_attempts:
                return result
            journal.append(
                "decision", action="membership", after_attempt=state.attempts,
                reason=failure.message, evidence=list(failure.evidence),
            )  # fmt: skip
            state.transient_in_row = 0

    def _generation(self, journal: Journal, state: RunState) -> AttemptResult:
        self._state = state
        d = self._join(state)
        if d.plan is None:  # "run" decisions always carry one; a foreign file might not
            raise _Ended(d.model_copy(update={"reason": "decision without a plan"}), state)
        self.decision, self.generation, self.preempted = d, d.generation, False
        state.plan = d.plan
        journal.append(
            "generation", generation=d.generation, leader=d.leader, nodes=list(d.nodes),
            world_size=d.world_size, rdzv_id=d.rdzv_id, plan=d.plan.model_dump(mode="json"),
            reason=d.reason,
        )  # fmt: skip
        if d.leader == self.mn.node_rank:
            self.events.publish("Generation", d.reason, _annotations(d))
        self.command = generation_command(self.base_command, len(d.nodes), d.rdzv_id)
        self.members.set("running", d.generation)
        return self._launch(journal, state, d)

    def _launch(self, journal: Journal, state: RunState, d: Decision) -> AttemptResult:
        number, resume, spec = self._prepare(journal, state)
        spec.env.setdefault("LOGLEVEL", "INFO")
        spec.env["DSSUP_GENERATION"] = str(d.generation)
        spec.env["DSSUP_NODE_RANK"] = str(self.mn.node_rank)
        journal.append(
            "attempt-started", attempt=number, generation=d.generation, token=spec.token,
            argv=spec.argv, plan=state.plan.model_dump(mode="json"), env=spec.env,
            notes=spec.notes, resume_from=str(resume.path) if resume else None,
            resume_step=resume.step if resume else None,
            relaunch_overhead_s=state.since_last_exit(),
        )  # fmt: skip
        result = run_attempt(
            spec, self.command, world_size=self.mn.nproc_per_node, grace_s=self.config.grace_s,
            gpu_timeout_s=self.config.gpu_release_timeout_s, sink=self.sink,
            stop_signal=lambda: self._signal or (signal.SIGTERM if self.preempted else None),
            on_start=lambda c: setattr(self, "_child", c),
            expected_global_batch=self._kept_global_batch(journal, state),
        )  # fmt: skip
        local = result.failure
        step = self._step()
        merged = self._verdict(d, result, spec.dir / "torchrun.log", step)
        result.failure = merged
        state.record(result, step)
        journal.append(
            "attempt-ended", attempt=number, generation=d.generation, exit_code=result.exit_code,
            duration_s=round(result.ended - result.started, 3),
            failure=merged.model_dump(mode="json") if merged else None,
            local_failure=local.model_dump(mode="json") if local else None,
            checkpoint_step=step, stragglers=result.stragglers,
        )  # fmt: skip
        if merged is not None and merged.kind.is_oom:
            state.tried.add(state.plan.key())
        output = JobView.output(rank0_output(self.command, spec.dir))
        derived = self.view.reported(output) if self.view is not None else []
        result.report = self._job_report(journal, number, spec.dir, state, derived)
        self._assess(journal, number, spec.dir)
        self.metrics.supervisor_attempt(merged.kind.value if merged else "success")
        self._write_metrics()
        return result

    def _verdict(
        self, d: Decision, result: AttemptResult, log_path: Any, step: int | None
    ) -> Failure | None:
        """Publish this node's report, gather the others', merge them into one root cause."""
        local = result.failure
        preempted = self.preempted and self._signal is None
        if preempted and local is not None and local.kind == FailureKind.INTERRUPTED:
            local = None
        group_rank, group_world = read_group(log_path)
        report = NodeReport(
            node=self.mn.node_rank, generation=d.generation, exit_code=result.exit_code,
            failure=local, group_rank=group_rank, group_world_size=group_world,
            checkpoint_step=step, preempted=preempted, ts=result.ended,
        )  # fmt: skip
        self.store.put(report_key(d.generation, self.mn.node_rank), report.model_dump(mode="json"))
        self.members.set("reporting", d.generation)
        if self._signal is not None:
            return result.failure  # dssup itself was told to stop: no waiting for peers
        reports = self._gather(d)
        joined = self.store.get(preempt_key(d.generation)) or {}
        merged = merge(d.nodes, reports, joined.get("joined", ()))
        if merged is not None and merged.signature == "split-brain":
            moved = quarantine_since(self.config.checkpoint_dir, d.created, self.mn.shared_dir)
            merged = merged.model_copy(
                update={"evidence": (*merged.evidence, f"quarantined checkpoints: {moved}")}
            )
        self._cause = merged
        return merged

    def _gather(self, d: Decision) -> dict[int, NodeReport | None]:
        deadline = time.monotonic() + self.mn.report_timeout_s
        while True:
            reports: dict[int, NodeReport | None] = {}
            for n in d.nodes:
                doc = self.store.get(report_key(d.generation, n))
                reports[n] = NodeReport.model_validate(doc) if doc else None
            missing = [n for n, r in reports.items() if r is None]
            if not missing or time.monotonic() >= deadline:
                return reports
            if not any(self.members.is_live(n) for n in missing):
                return reports
            time.sleep(self.mn.poll_s)

    # --- decisions -----------------------------------------------------------------------
    def _remedy(self, journal: Journal, state: RunState, failure: Failure) -> bool:
        if failure.signature in MEMBERSHIP_SIGNATURES:
            journal.append(
                "decision", action="membership", after_attempt=state.attempts,
                reason=failure.message, evidence=list(failure.evidence),
            )  # fmt: skip
            return True
        if self.members.leader() != self.mn.node_rank:
            journal.append(
                "decision", action="follow", after_attempt=state.attempts,
                reason=f"root cause {failure.kind} ({clip(failure.message, 160)}); "
                "the leader decides the next plan",
            )  # fmt: skip
            return True
        return super()._remedy(journal, state, failure)


def _annotations(d: Decision) -> dict[str, str]:
    plan = d.plan.describe() if d.plan else ""
    return {
        "dssup.io/generation": str(d.generation),
        "dssup.io/world-size": str(d.world_size),
        "dssup.io/plan": plan,
    }
