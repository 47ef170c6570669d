"""The torchrun child: start it, stream its output, signal it, and make sure nothing survives it.

torchrun starts every worker in a session of its own, so a process group cannot reach them.
dssup instead marks each attempt with ``DSSUP_RUN_TOKEN=<run-id>/<attempt>`` in the environment,
which every descendant inherits, and finds the attempt's processes by scanning
``/proc/*/environ``. That is how it waits for failed workers to be gone before relaunching, how
it kills stragglers, and how a supervisor restarted after SIGKILL finds the previous attempt's
orphans. torchrun also gets ``PR_SET_PDEATHSIG=SIGTERM``: if dssup dies, torchrun is told to stop
its workers at once.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from dssup.errors import LaunchError

__all__ = [
    "Child",
    "kill_quietly",
    "processes_with_token",
    "terminate_token",
    "wait_gone",
]

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1
TAIL = 400


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class Child:
    """One torchrun process with its output streamed to a log file, a tail and a sink."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        sink: Callable[[str], None] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.argv, self.env, self.log_path, self.sink, self.cwd = argv, env, log_path, sink, cwd
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self._reader: threading.Thread | None = None

    def start(self) -> int:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.proc = subprocess.Popen(
                [resolve_executable(self.argv[0], self.env), *self.argv[1:]],
                env=self.env,
                cwd=self.cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_pdeathsig,  # noqa: PLW1509
            )
        except FileNotFoundError as exc:
            raise LaunchError(f"command not found: {self.argv[0]}", exit_code=127) from exc
        except PermissionError as exc:
            raise LaunchError(f"command not runnable: {self.argv[0]}", exit_code=126) from exc
        self.started_at = time.monotonic()
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        return self.proc.pid

    def _pump(self, stream: IO[bytes]) -> None:
        with open(self.log_path, "ab") as out:
            for raw in iter(stream.readline, b""):
                out.write(raw)
                out.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                self.tail.append(line)
                if self.sink is not None:
                    self.sink(line)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    def send(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status (negative for a signal), or None on timeout."""
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def console_tail(self) -> str:
        return "\n".join(self.tail)


def resolve_executable(name: str, env: dict[str, str]) -> str:
    """``name`` on the child's PATH, else beside our own interpreter (an unactivated venv)."""
    if os.sep in name or shutil.which(name, path=env.get("PATH")):
        return name
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else name


def processes_with_token(token: str) -> list[int]:
    """PIDs (other than ours) whose environment carries ``DSSUP_RUN_TOKEN=token``."""
    needle = f"DSSUP_RUN_TOKEN={token}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read() + b"\0"
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if needle in environ and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def wait_gone(token: str, timeout: float, poll: float = 0.02) -> list[int]:
    """Wait until no process carries the token; returns those still alive at the timeout."""
    deadline = time.monotonic() + timeout
    while (alive := processes_with_token(token)) and time.monotonic() < deadline:
        time.sleep(poll)
    return alive


def terminate_token(token: str, grace: float = 10.0) -> list[int]:
    """SIGTERM every process of the token, SIGKILL what is left after ``grace``; returns killed."""
    victims = processes_with_token(token)
    for pid in victims:
        kill_quietly(pid, signal.SIGTERM)
    alive = wait_gone(token, grace)
    for pid in alive:
        log.warning("pid %s ignored SIGTERM for %.0f s: SIGKILL", pid, grace)
        kill_quietly(pid, signal.SIGKILL)
    left = wait_gone(token, 5.0)
    if left:
        log.error("processes survive SIGKILL: %s", left)
    return victims


def kill_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
