"""The error-file watch that lets dssup stop an attempt at the root cause's first trace."""

import os
import shutil
import time
from pathlib import Path

from dssup.supervisor.fastfail import ErrorFileWatch
from dssup.supervisor.models import FailureKind

CAPTURES = Path(__file__).parents[2] / "fixtures" / "supervisor" / "captures"


def _rank_file(capture: str, rank: int) -> Path:
    return next((CAPTURES / capture / "logs").glob(f"*/attempt_*/{rank}/error.json"))


def _place(log_dir: Path, rank: int, src: Path | None = None, text: str | None = None) -> Path:
    dest = log_dir / "abc_1" / "attempt_0" / str(rank) / "error.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src is not None:
        shutil.copy(src, dest)
    else:
        dest.write_text(text or "")
    return dest


def test_stops_on_the_oom_rank_not_on_the_cascade(tmp_path):
    watch = ErrorFileWatch(tmp_path, since=time.time() - 5, every_s=0)
    assert watch.poll() is None
    _place(tmp_path, 0, _rank_file("cuda_oom", 0))  # rank 0: connection closed by peer
    assert watch.poll() is None
    _place(tmp_path, 1, _rank_file("cuda_oom", 1))
    verdict = watch.poll()
    assert verdict.kind == FailureKind.CUDA_OOM and verdict.rank == 1


def test_half_written_file_is_read_again_and_old_files_are_ignored(tmp_path):
    watch = ErrorFileWatch(tmp_path, since=time.time() - 5, every_s=0)
    path = _place(tmp_path, 1, text='{"message": {"mess')
    assert watch.poll() is None
    shutil.copy(_rank_file("cpu_oom", 1), path)
    assert watch.poll().kind == FailureKind.HOST_OOM
    old = ErrorFileWatch(tmp_path, since=time.time() + 60, every_s=0)
    os.utime(path, (time.time() - 120, time.time() - 120))
    assert old.poll() is None


def test_transient_errors_do_not_stop_the_attempt(tmp_path):
    watch = ErrorFileWatch(tmp_path, since=time.time() - 5, every_s=0)
    _place(tmp_path, 1, _rank_file("transient", 1))
    assert watch.poll() is None
