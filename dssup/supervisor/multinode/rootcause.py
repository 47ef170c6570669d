"""One root cause from every node's evidence.

Each node's supervisor classifies its own ranks; on a multi-node job that is not enough. An OOM
on node A makes node B's ranks die of ``Connection closed by peer``, an NCCL watchdog timeout or
SIGABRT: on B alone that looks like a communication failure. Merged, the rule is:

1. a node that failed *of its own* (an OOM of any kind, a user error) is the root cause; the
   others' communication failures are its cascade (earliest report first when several did);
2. otherwise, a node that never reported and whose heartbeat stopped was *lost*: that is a
   membership change, not a fault of the job, and the generation is re-planned without it;
3. a group smaller than the decision's node set means two groups formed (split brain);
4. otherwise an unknown failure anywhere wins over pure cascades, and when some node finished
   cleanly while the others only saw their peers go away, the job completed (teardown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dssup.supervisor.models import Failure, FailureKind
from dssup.supervisor.multinode.records import NodeReport
from dssup.supervisor.text import clip

__all__ = ["MEMBERSHIP_SIGNATURES", "merge"]

K = FailureKind
_OWN = {K.CUDA_OOM, K.HOST_OOM, K.LOAD_OOM, K.COMM_OOM, K.USER_ERROR}
MEMBERSHIP_SIGNATURES = frozenset({"node-lost", "node-joined", "split-brain"})


def _line(node: int, r: NodeReport | None) -> str:
    if r is None:
        return f"node {node}: no report (heartbeat stopped)"
    if r.preempted:
        return f"node {node}: stopped for a membership change"
    if r.failure is None:
        return f"node {node}: finished (exit {r.exit_code})"
    return (
        f"node {node}: {r.failure.kind} via {r.failure.signature}: {clip(r.failure.message, 120)}"
    )


def _tagged(f: Failure, node: int, evidence: list[str], role: str) -> Failure:
    return f.model_copy(
        update={
            "message": f"node {node}: {f.message}",
            "evidence": (*f.evidence, *evidence, f"root cause: node {node} ({role})"),
        }
    )


def _membership(signature: str, message: str, evidence: list[str], kind: K = K.COMM) -> Failure:
    return Failure(kind=kind, signature=signature, message=message, evidence=tuple(evidence))


def merge(
    nodes: Sequence[int], reports: Mapping[int, NodeReport | None], joined: Sequence[int] = ()
) -> Failure | None:
    """The generation's verdict; None when every node finished cleanly."""
    evidence = [_line(n, reports.get(n)) for n in nodes]
    got = {n: r for n, r in reports.items() if r is not None and n in nodes}
    own = [(r.ts, n, r.failure) for n, r in got.items() if r.failure and r.failure.kind in _OWN]
    if own:
        _, node, failure = min(own, key=lambda t: (t[0], t[1]))
        return _tagged(failure, node, evidence, "failed on its own; other nodes are cascades")
    lost = [n for n in nodes if n not in got]
    if lost:
        message = f"node(s) {lost} lost: no report and no heartbeat"
        return _membership("node-lost", message, evidence)
    if any(r.preempted for r in got.values()):
        message = f"node(s) {list(joined)} joined: generation stopped to re-plan"
        return _membership("node-joined", message, evidence)
    split = [n for n, r in got.items() if r.group_world_size and r.group_world_size < len(nodes)]
    if split:
        message = (
            f"split brain: node(s) {split} formed a group smaller than the {len(nodes)} "
            "nodes decided (two groups writing one checkpoint)"
        )
        return _membership("split-brain", message, evidence)
    failed = [(n, r.failure) for n, r in got.items() if r.failure and r.failure.kind != K.TEARDOWN]
    if not failed:
        return None
    clean = [n for n, r in got.items() if r.failure is None or r.failure.kind == K.TEARDOWN]
    unknown = [(n, f) for n, f in failed if f.kind not in {K.COMM, K.INTERRUPTED}]
    if unknown:
        node, failure = unknown[0]
        return _tagged(failure, node, evidence, "unknown failure")
    if clean:
        message = f"node(s) {clean} finished; the others only lost their peers at shutdown"
        return Failure(kind=K.TEARDOWN, message=message, evidence=tuple(evidence))
    node, failure = failed[0]
    return _tagged(failure, node, evidence, "every node reports only communication failures")
