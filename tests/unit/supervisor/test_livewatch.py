"""Watching a running attempt without @record: a rank's traceback on stderr (captured from a
real allocator OOM), fatal messages, the job's report, and the console fold of torchrun's
own traceback (a real torchrun console)."""

from __future__ import annotations

from pathlib import Path

from dssup.jobreport import Started, append_record
from dssup.supervisor.consolefold import LauncherTracebackFold
from dssup.supervisor.launchers import DEEPSPEED, TORCHRUN
from dssup.supervisor.livewatch import OutputWatch, ReportWatch
from dssup.supervisor.models import FailureKind

CAPTURES = Path(__file__).parents[2] / "fixtures" / "supervisor" / "captures"


def _captured(rank: int) -> list[str]:
    path = next((CAPTURES / "cpu_oom" / "logs").glob(f"*/attempt_*/{rank}/stderr.log"))
    return path.read_text().splitlines(keepends=True)


def _rank_file(log_dir: Path, rank: int) -> Path:
    path = log_dir / "run_x" / "attempt_0" / str(rank) / "stderr.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def test_a_dying_oom_traceback_stops_the_attempt_with_its_phase(tmp_path):
    watch = OutputWatch(tmp_path, TORCHRUN, every_s=0)
    out1, out0 = _rank_file(tmp_path, 1), _rank_file(tmp_path, 0)
    lines = _captured(1)
    last = max(i for i, ln in enumerate(lines) if "DefaultCPUAllocator" in ln)
    with open(out1, "a") as fh:
        fh.writelines(lines[:last])
    with open(out0, "a") as fh:
        fh.writelines(_captured(0))  # rank 0: connection closed by peer, a cascade
    assert watch.poll() is None
    with open(out1, "a") as fh:
        fh.writelines(lines[last:])
    verdict = watch.poll()
    assert verdict is not None and verdict.kind == FailureKind.HOST_OOM
    assert (verdict.rank, verdict.phase, verdict.signature) == (1, "forward", "cpu-allocator")
    assert "live-stderr" in verdict.sources


def test_a_traceback_the_script_caught_and_logged_does_not_stop_it(tmp_path):
    out = _rank_file(tmp_path, 0)
    out.write_text(
        "Traceback (most recent call last):\n"
        '  File "/job/train.py", line 40, in step\n'
        "    loss = model(batch)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "retrying with a smaller batch\n"
    )
    assert OutputWatch(tmp_path, TORCHRUN, every_s=0).poll() is None


def test_python_cannot_open_the_script_stops_at_once_as_a_user_error(tmp_path):
    out = _rank_file(tmp_path, 0)
    out.write_text("/usr/bin/python3: can't open file '/job/trian.py': [Errno 2] No such file\n")
    verdict = OutputWatch(tmp_path, TORCHRUN, every_s=0).poll()
    assert verdict is not None and verdict.kind == FailureKind.USER_ERROR
    assert verdict.signature == "missing-script" and "trian.py" in verdict.message


def test_deepspeed_rank_logs_are_echoed_with_the_rank(tmp_path):
    (tmp_path / "20261201120000_rank1.log").write_text("step 0 loss 5.5\n")
    (tmp_path / "20261201120000_rank0.log").write_text("partial")  # no newline yet
    seen: list[str] = []
    OutputWatch(tmp_path, DEEPSPEED, every_s=0, echo=seen.append).poll()
    assert seen == ["[rank1]: step 0 loss 5.5"]


def test_the_report_watch_stops_at_a_global_batch_mismatch(tmp_path):
    path = tmp_path / "report.jsonl"
    watch = ReportWatch(path, expected=32, every_s=0)
    assert watch.poll() is None
    good = Started(rank=0, world_size=2, dp=2, micro_batch=8, grad_accum=2, global_batch=32)
    append_record(path, good)
    assert watch.poll() is None
    append_record(path, good.model_copy(update={"rank": 1, "grad_accum": 1, "global_batch": 16}))
    check = watch.poll()
    assert check is not None and check.status == "mismatch" and "rank 1" in check.detail


def test_torchruns_own_traceback_is_folded_to_one_line(tmp_path):
    shown: list[str] = []
    fold = LauncherTracebackFold(shown.append, tmp_path / "torchrun.log")
    for line in (CAPTURES / "cpu_oom" / "torchrun.log").read_text().splitlines():
        fold(line)
    fold.flush()
    text = "\n".join(shown)
    assert "ChildFailedError" in text and "raise ChildFailedError(" not in text
    assert text.count("Root Cause") == 0
    folded = [ln for ln in shown if ln.startswith("dssup: the launcher's ChildFailedError")]
    assert len(folded) == 1 and "rank 1 exit 1" in folded[0]
    assert any("[default1]:[rank1]: Traceback (most recent call last):" in ln for ln in shown)
    other: list[str] = []
    fold = LauncherTracebackFold(other.append, tmp_path / "x.log")
    for line in ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>',
                 "RuntimeError: the worker's own, unprefixed"]:  # fmt: skip
        fold(line)
    assert other[-1] == "RuntimeError: the worker's own, unprefixed" and len(other) == 3
