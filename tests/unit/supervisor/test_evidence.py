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
