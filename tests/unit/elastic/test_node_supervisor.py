"""``MultiNodeSupervisor`` pieces that need no torchrun: a node started after the run ended
stops at once with the run's outcome instead of waiting for a generation that never comes."""

from __future__ import annotations

import time
from pathlib import Path

from dssup.cli.run import build_supervisor
from dssup.elastic import NodeRange
from dssup.supervisor.multinode import MultiNodeConfig, MultiNodeSupervisor
from dssup.supervisor.multinode.records import Decision, decision_key

CMD = ["torchrun", "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
       "--rdzv-endpoint", "127.0.0.1:1", "train.py"]  # fmt: skip


def _node(tmp: Path, rank: int) -> MultiNodeSupervisor:
    opts = {"run_dir": tmp / f"node-{rank}", "global_batch_size": 8, "micro_batch_size": 2,
            "device": "cpu", "quiet": True, "adapters": False}  # fmt: skip
    sup = build_supervisor(CMD, opts)
    cfg = MultiNodeConfig(
        shared_dir=tmp, node_rank=rank, nodes=NodeRange.parse("1:2"), run_name="job",
        heartbeat_s=0.1, member_timeout_s=1.0, decision_timeout_s=5, settle_s=0,
    )  # fmt: skip
    return MultiNodeSupervisor.wrap(sup, cfg)


def test_a_node_that_arrives_after_the_end_leaves_with_the_runs_outcome(tmp_path: Path) -> None:
    end = Decision(generation=4, action="end", leader=0, outcome="succeeded",
                   reason="node 0: training finished", exit_code=0, created=time.time())  # fmt: skip
    node = _node(tmp_path, 1)
    node.store.publish(decision_key(4), end.model_dump(mode="json"))
    t0 = time.monotonic()
    outcome = node.run()
    assert time.monotonic() - t0 < 4  # no waiting for a generation 5
    assert outcome.exit_code == 0
    ended = outcome.journal.last("run-ended")
    assert ended is not None and ended["outcome"] == "succeeded"
    assert outcome.journal.of_type("attempt-started") == []  # nothing was launched


def test_wrap_keeps_the_single_node_settings(tmp_path: Path) -> None:
    node = _node(tmp_path, 0)
    assert node.config.initial_plan.world_size == 2  # MAX nodes x nproc: the user's own plan
    assert node.config.initial_plan.micro_batch == 2 and node.config.initial_plan.grad_accum == 2
    assert node.base_command.option("rdzv-id") is None and node.generation == 0
