"""Classify real captured torchrun failures (tests/fixtures/supervisor/captures, made by
capture.py from real runs) without launching anything: the verdict must match what was
expected when the failure was provoked."""

import json
from pathlib import Path

import pytest

from dssup.supervisor.classify import classify
from dssup.supervisor.evidence import collect
from dssup.supervisor.models import FailureKind

CAPTURES = Path(__file__).parents[2] / "fixtures" / "supervisor" / "captures"
CASES = sorted(p.name for p in CAPTURES.iterdir() if (p / "meta.json").is_file())


def verdict(name: str):
    d = CAPTURES / name
    meta = json.loads((d / "meta.json").read_text())
    ev = collect(
        d,
        meta["exit_code"],
        (d / "torchrun.log").read_text(),
        oom_kills=meta["oom_kills"],
        world_size=meta["world_size"],
    )
    return classify(ev), meta["expected"]


def test_every_case_is_captured():
    assert set(CASES) >= {
        "cuda_oom",
        "cpu_oom",
        "cgroup_oom",
        "syntax_error",
        "load_oom",
        "comm_oom",
        "teardown_abort",
        "transient",
    }


@pytest.mark.parametrize("name", CASES)
def test_captured_failure_is_classified_as_expected(name):
    failure, expected = verdict(name)
    assert failure is not None
    assert failure.kind == expected["kind"]
    assert failure.rank == expected["rank"]
    assert failure.signature == expected["signature"]


def test_cuda_oom_numbers_are_parsed_and_the_peer_is_a_cascade():
    failure, _ = verdict("cuda_oom")
    assert failure.tried_to_allocate == 2 << 30
    assert failure.reserved_unallocated == int(2.25 * (1 << 30))
    assert failure.total_bytes == int(79.11 * (1 << 30))
    peer = next(r for r in failure.ranks if r.rank == 0)
    assert peer.cascade and peer.signature in {"gloo-peer-closed", "stopped-by-agent"}


def test_cpu_allocator_failure_names_the_request_and_demotes_the_peer():
    failure, _ = verdict("cpu_oom")
    assert failure.tried_to_allocate and failure.tried_to_allocate > 0
    assert failure.phase in {"forward", "backward"}
    assert [r.rank for r in failure.ranks if not r.cascade] == [1]


def test_oom_killer_needs_cgroup_evidence():
    d = CAPTURES / "cgroup_oom"
    meta = json.loads((d / "meta.json").read_text())
    assert meta["oom_kills"] >= 1
    ev = collect(d, meta["exit_code"], (d / "torchrun.log").read_text(), oom_kills=0, world_size=2)
    failure = classify(ev)
    assert failure.kind == FailureKind.TRANSIENT and failure.signal == 9


def test_teardown_abort_is_not_a_failure_only_with_every_done_marker():
    d = CAPTURES / "teardown_abort"
    meta = json.loads((d / "meta.json").read_text())
    ev = collect(d, meta["exit_code"], (d / "torchrun.log").read_text(), world_size=3)
    failure = classify(ev)
    assert failure.kind == FailureKind.TRANSIENT
    assert failure.signature == "abort-without-exception" and failure.signal == 6


def test_user_errors_are_not_retryable():
    failure, _ = verdict("syntax_error")
    assert not failure.retryable
