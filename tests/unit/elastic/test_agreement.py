"""Multi-node agreement on real files: exclusive publish under a race of real processes,
atomic replace, heartbeats and leadership, one decision for every node."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

from dssup.elastic import NodeRange
from dssup.supervisor.models import TrainingPlan
from dssup.supervisor.multinode.agree import Agreement, Proposal, usable_nodes
from dssup.supervisor.multinode.config import MultiNodeConfig
from dssup.supervisor.multinode.membership import Membership
from dssup.supervisor.multinode.records import Decision
from dssup.supervisor.multinode.store import SharedStore


def _publish(root: str, node: int, start: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    while time.time() < start:
        pass
    won, doc = SharedStore(Path(root)).publish("generations/g000001", {"leader": node})
    out.put((node, won, doc["leader"]))


def test_exclusive_publish_has_one_winner_among_racing_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    start = time.time() + 1.5
    procs = [ctx.Process(target=_publish, args=(str(tmp_path), n, start, queue)) for n in range(6)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    winners = [node for node, won, _ in results if won]
    assert len(winners) == 1
    assert {seen for _, _, seen in results} == {winners[0]}  # everyone reads the winner
    assert not list((tmp_path / "generations").glob(".*"))  # no temporary files left


def test_put_is_atomic_for_concurrent_readers(tmp_path: Path) -> None:
    store = SharedStore(tmp_path)
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            store.put("members/node-0000", {"i": i, "pad": "x" * (200_000 + i % 7)})
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    seen = 0
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            doc = store.get("members/node-0000")
            if doc is not None:
                assert len(doc["pad"]) >= 200_000
                seen += 1
    finally:
        stop.set()
        t.join()
    assert seen > 10


def test_wait_times_out_and_never_returns_another_generation(tmp_path: Path) -> None:
    store = SharedStore(tmp_path)
    store.put("generations/g000001", {"g": 1})
    t0 = time.monotonic()
    assert store.wait("generations/g000002", timeout_s=0.3, poll_s=0.05) is None
    assert time.monotonic() - t0 >= 0.3
    threading.Timer(0.2, lambda: store.put("generations/g000002", {"g": 2})).start()
    assert store.wait("generations/g000002", timeout_s=5, poll_s=0.05) == {"g": 2}


def test_leader_is_lowest_live_node_and_stale_nodes_drop_out(tmp_path: Path) -> None:
    store = SharedStore(tmp_path)
    now = [1000.0]
    members = {n: Membership(store, n, 1.0, 5.0, clock=lambda: now[0]) for n in (0, 1, 2)}
    for m in members.values():
        m.beat()
    view = members[2]
    assert view.leader() == 0
    now[0] += 3
    members[1].beat()
    members[2].beat()
    now[0] += 3  # node 0 silent for 6 s > 5 s
    assert [m.node for m in view.live()] == [1, 2]
    assert view.leader() == 1
    members[1].set("ended", 3)
    assert view.leader() == 2


def _cfg(tmp: Path, node: int, nodes: str = "1:2", settle: float = 0.5) -> MultiNodeConfig:
    return MultiNodeConfig(
        shared_dir=tmp, node_rank=node, nodes=NodeRange.parse(nodes), run_name="job",
        heartbeat_s=0.1, member_timeout_s=1.0, settle_s=settle, poll_s=0.02,
        decision_timeout_s=10,
    )  # fmt: skip


PLAN = TrainingPlan(micro_batch=4, grad_accum=2, global_batch=16, dp=2, world_size=2)


def _agreement(tmp: Path, node: int, nodes: str = "1:2", settle: float = 0.5) -> Agreement:
    cfg = _cfg(tmp, node, nodes, settle)
    store = SharedStore(tmp)
    members = Membership(store, node, cfg.heartbeat_s, cfg.member_timeout_s)

    def decide(p: Proposal) -> Decision:
        return Decision(
            generation=p.generation, action="run", leader=node, nodes=p.nodes,
            world_size=len(p.nodes), plan=PLAN, rdzv_id=f"job-g{p.generation}",
            created=time.time(),
        )  # fmt: skip

    return Agreement(cfg, store, members, lambda: PLAN, decide)


def test_two_nodes_get_one_decision_made_by_the_lowest_rank(tmp_path: Path) -> None:
    # node 1 arrives first; a settle far longer than the 0.1 s stagger keeps it from deciding
    # alone on a loaded machine, and costs nothing: the decision comes once both are there
    a, b = _agreement(tmp_path, 0, settle=10), _agreement(tmp_path, 1, settle=10)
    got: dict[int, Decision | None] = {}
    threads = [
        threading.Thread(target=lambda ag=ag, n=n: got.__setitem__(n, ag.wait_for(1)))
        for n, ag in ((1, b), (0, a))
    ]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=20)
    assert got[0] == got[1] and got[0] is not None
    assert got[0].leader == 0 and got[0].nodes == (0, 1) and got[0].rdzv_id == "job-g1"


def test_a_lone_node_decides_after_settling_within_min_max(tmp_path: Path) -> None:
    b = _agreement(tmp_path, 1, settle=0.3)
    t0 = time.monotonic()
    d = b.wait_for(1)
    assert d is not None and d.nodes == (1,) and d.leader == 1
    assert time.monotonic() - t0 >= 0.3


def test_below_min_nodes_nobody_launches(tmp_path: Path) -> None:
    b = _agreement(tmp_path, 1, nodes="2:2", settle=0.0)
    b.cfg = b.cfg.model_copy(update={"decision_timeout_s": 0.5})
    assert b.wait_for(1) is None


def test_usable_nodes_keeps_the_global_batch_exact(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, 0, "1:4")
    plan = TrainingPlan(micro_batch=1, grad_accum=2, global_batch=8, dp=4, world_size=4)
    assert [usable_nodes(n, cfg, plan) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 4, 4]
