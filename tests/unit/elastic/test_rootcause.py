"""One root cause from every node's report: cascades never win, lost nodes re-plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from dssup.supervisor.command import parse_command
from dssup.supervisor.models import Failure, FailureKind
from dssup.supervisor.multinode.launch import generation_command, read_group
from dssup.supervisor.multinode.records import NodeReport
from dssup.supervisor.multinode.rootcause import merge
from dssup.supervisor.multinode.splitbrain import quarantine_since

K = FailureKind
OOM = Failure(kind=K.HOST_OOM, signature="cpu-alloc", message="DefaultCPUAllocator: can't allocate")
PEER = Failure(kind=K.COMM, signature="gloo-peer-closed", message="Connection closed by peer")
ABORT = Failure(kind=K.TRANSIENT, signature="SIGABRT", message="")


def _r(node: int, failure: Failure | None, ts: float = 10.0, **kw: object) -> NodeReport:
    return NodeReport(node=node, generation=3, exit_code=1 if failure else 0, failure=failure,
                      ts=ts, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_oom_on_one_node_is_the_cause_even_when_its_report_comes_last() -> None:
    verdict = merge((0, 1), {0: _r(0, PEER, ts=5.0), 1: _r(1, OOM, ts=9.0)})
    assert verdict is not None and verdict.kind == K.HOST_OOM
    assert verdict.message.startswith("node 1:")
    assert any("node 0: comm" in e for e in verdict.evidence)


def test_earliest_of_two_own_failures_wins() -> None:
    verdict = merge((0, 1), {0: _r(0, OOM, ts=7.0), 1: _r(1, OOM, ts=6.0)})
    assert verdict is not None and verdict.message.startswith("node 1:")


def test_a_silent_node_is_a_membership_change_not_a_fault() -> None:
    verdict = merge((0, 1), {0: _r(0, PEER), 1: None})
    assert verdict is not None and verdict.signature == "node-lost" and verdict.kind == K.COMM


def test_an_oom_beats_a_lost_node() -> None:
    verdict = merge((0, 1), {0: _r(0, OOM), 1: None})
    assert verdict is not None and verdict.kind == K.HOST_OOM


def test_preemption_for_a_joining_node() -> None:
    verdict = merge((0,), {0: _r(0, None, preempted=True)}, joined=[1])
    assert verdict is not None and verdict.signature == "node-joined" and "[1]" in verdict.message


def test_smaller_group_than_decided_is_split_brain() -> None:
    reports = {0: _r(0, None, group_world_size=1), 1: _r(1, None, group_world_size=1)}
    verdict = merge((0, 1), reports)
    assert verdict is not None and verdict.signature == "split-brain"


@pytest.mark.parametrize(
    ("reports", "kind"),
    [
        ({0: None, 1: None}, None),
        ({0: "clean", 1: "clean"}, None),
        ({0: "clean", 1: "peer"}, K.TEARDOWN),
        ({0: "peer", 1: "peer"}, K.COMM),
        ({0: "peer", 1: "abort"}, K.TRANSIENT),
    ],
)
def test_table(reports: dict[int, str | None], kind: FailureKind | None) -> None:
    table = {"clean": None, "peer": PEER, "abort": ABORT}
    got = {n: _r(n, table[v]) for n, v in reports.items() if v is not None}
    got.update({n: _r(n, None) for n, v in reports.items() if v is None})
    verdict = merge((0, 1), got)
    assert (verdict.kind if verdict else None) == kind


def test_generation_command_fixes_nnodes_and_scopes_the_rendezvous_id() -> None:
    cmd = parse_command(
        ["torchrun", "--nnodes=1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
         "--rdzv_id", "old", "--nproc-per-node", "1", "train.py", "--nnodes-like", "x"],
        env={},
    )  # fmt: skip
    gen = generation_command(cmd, 1, "job-g7")
    argv = gen.argv([])
    assert argv.count("--nnodes") == 1 and argv[argv.index("--nnodes") + 1] == "1"
    assert "old" not in argv and argv[argv.index("--rdzv-id") + 1] == "job-g7"
    assert argv[-3:] == ["train.py", "--nnodes-like", "x"]
    assert gen.option("nnodes") == "1" and cmd.option("nnodes") == "1:2"


def test_read_group_from_torchrun_log(tmp_path: Path) -> None:
    log = tmp_path / "torchrun.log"
    log.write_text("I ... api.py:553]   group_rank=1\nI ... api.py:553]   group_world_size=2\n")
    assert read_group(log) == (1, 2)
    assert read_group(tmp_path / "missing.log") == (None, None)


def test_quarantine_moves_only_what_the_split_generation_wrote(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_00000002").mkdir(parents=True)
    old = ckpt / "step_00000002"
    import os

    os.utime(old, (1000, 1000))
    (ckpt / "step_00000004").mkdir()
    moved = quarantine_since(ckpt, 2000, tmp_path / "shared")
    assert moved == ["step_00000004"]
    assert old.exists() and not (ckpt / "step_00000004").exists()
    assert list((tmp_path / "shared" / "quarantine").glob("*/step_00000004"))
