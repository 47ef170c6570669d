"""Reading torchrun's failure table and error files (both formats)."""

import json

from dssup.supervisor.evidence import last_exception, parse_failure_table, read_error_file

TABLE = """
Failures:
[1]:
  time      : 2026-11-29_20:18:46
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 8985)
  error_file: /tmp/x/0/error.json
  traceback : Signal 15 (SIGTERM) received by PID 8985
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_20:18:44
  host      : box
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 8986)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 8986
"""


def test_failure_table():
    assert parse_failure_table(TABLE) == [
        {"rank": 0, "local_rank": 0, "exit_code": -15, "pid": 8985},
        {"rank": 3, "local_rank": 1, "exit_code": -9, "pid": 8986},
    ]


def test_error_file_formats(tmp_path):
    nested = tmp_path / "a.json"
    nested.write_text(
        json.dumps(
            {
                "message": {
                    "message": "OutOfMemoryError: CUDA out of memory.",
                    "extraInfo": {"py_callstack": "Traceback", "timestamp": "1754300000"},
                    "errorCode": 1,
                }
            }
        )
    )
    doc = read_error_file(nested)
    assert doc["timestamp"] == 1754300000 and doc["error_code"] == 1
    flat = tmp_path / "b.json"
    flat.write_text(json.dumps({"message": "boom", "timestamp": 12}))
    assert read_error_file(flat)["message"] == "boom"
    assert read_error_file(tmp_path / "missing.json") is None


def test_last_exception_line():
    tail = "Traceback...\n[rank1]:   File x\n[rank1]: ValueError: bad plan\n"
    assert last_exception(tail) == "ValueError: bad plan"


def test_only_cascades_means_the_root_cause_was_not_seen_here():
    from dssup.supervisor.classify import classify
    from dssup.supervisor.evidence import AttemptEvidence, RankEvidence
    from dssup.supervisor.models import FailureKind

    peer = RankEvidence(
        local_rank=0,
        rank=0,
        exit_code=1,
        sources=["error-file"],
        message="RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:1",
    )
    ev = AttemptEvidence(
        exit_code=1,
        ranks={0: peer},
        root_cause=None,
        console_tail="",
        done_ranks=set(),
        world_size=16,
    )
    failure = classify(ev)
    assert failure.kind == FailureKind.COMM and failure.retryable
    assert any("root cause unseen" in e for e in failure.evidence)
