"""Runs the documents' commands in the background, so the docs tests cost the suite little time.

Why: running every documented command takes minutes (real calibrations, real ``dssup run``
recoveries), nearly all of it one process at a time, while the rest of the suite also keeps
one of CI's two cores busy. ``tests/docs/conftest.py`` starts this runner when collection ends
and moves the docs tests to the end of the session; by the time they run, their commands have
run beside the other tests and each test only checks its snippet's recorded result. Run alone
(``pytest tests/docs``), the tests wait for their results, two documents at a time.

What a command sees does not change: each document runs its snippets in document order in its
own sandbox (the repository's folders linked in), with the environment as it was when the
session started (another test's ``monkeypatch.setenv`` never reaches it), each command under
its own timeout, killed with everything it started when the timeout or the session ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.docs.doccheck import REPO, Command, Snippet
from tests.procs import reap, reap_tokens
from tests.repo import repo_state

__all__ = ["LINKED", "TIMEOUT", "Outcome", "Runner"]

LINKED = ("examples", "k8s", "docs", "dssup", "tests", "bench", "scripts", "gpu")
TIMEOUT = 900  # s per command: the slowest documented one (a full DeepSeek-V3 trace) is ~60 s
RUNS = ("shell", "python", "keys")  # the snippet kinds that run a command


@dataclass
class Outcome:
    """What running one snippet's commands gave: one result per command, or why it stopped."""

    results: list[tuple[Command, subprocess.CompletedProcess[str]]] = field(default_factory=list)
    failure: str = ""
    done: threading.Event = field(default_factory=threading.Event)


class Runner:
    """Every selected snippet that runs a command, by document, on ``workers`` threads."""

    def __init__(self, snippets: list[Snippet], workers: int) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="dssup-docs-"))
        self.env = _env(dict(os.environ))
        self.before = repo_state()
        self.outcomes: dict[str, Outcome] = {}
        self._docs: dict[str, list[Snippet]] = {}
        for s in snippets:
            if s.kind in RUNS and not s.skip:
                self._docs.setdefault(s.doc, []).append(s)
                self.outcomes[s.where] = Outcome()
        self._queue = list(self._docs)
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen[str]] = set()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"docs-{i}", daemon=True)
            for i in range(max(1, min(workers, len(self._queue))))
        ]
        for t in self._threads:
            t.start()

    def outcome(self, snip: Snippet, timeout: float) -> Outcome:
        """``snip``'s outcome, once its commands have run (the ones before it in its document
        first)."""
        out = self.outcomes[snip.where]
        if not out.done.wait(timeout):
            out.failure = f"not run within {timeout:.0f} s"
        return out

    def finished(self, timeout: float) -> bool:
        """Wait for every document; whether all finished."""
        return all(o.done.wait(timeout) for o in self.outcomes.values())

    def close(self) -> None:
        """Stop: nothing queued starts, every live command is killed with what it started."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            live = list(self._live)
        for proc in live:
            reap(proc, None, grace=5)
        reap_tokens([j.parent for j in self.base.rglob("journal.jsonl")])
        for t in self._threads:
            t.join(10)
        shutil.rmtree(self.base, ignore_errors=True)

    def _work(self) -> None:
        while True:
            with self._lock:
                if self._closed or not self._queue:
                    return
                doc = self._queue.pop(0)
            box = self._sandbox(doc)
            for snip in self._docs[doc]:
                out = self.outcomes[snip.where]
                try:
                    self._run_snippet(snip, box, out)
                except Exception as exc:  # recorded: the snippet's test reports it
                    out.failure = f"{type(exc).__name__}: {exc}"
                finally:
                    out.done.set()

    def _sandbox(self, doc: str) -> Path:
        box = self.base / re.sub(r"[^A-Za-z0-9]+", "-", doc)
        box.mkdir(parents=True, exist_ok=True)
        for name in LINKED:
            (box / name).symlink_to(REPO / name)
        return box

    def _run_snippet(self, snip: Snippet, box: Path, out: Outcome) -> None:
        if snip.kind == "shell":
            commands = snip.commands
        elif snip.kind == "python":
            code = snip.text
            if snip.fragment:  # the reader's own objects: compile, run the imports
                compile(code, snip.where, "exec")
                code = "\n".join(
                    line for line in code.splitlines() if re.match(r"\s*(from \S+ )?import ", line)
                )
            (box / "snippet.py").write_text(code)
            commands = [Command(f"{sys.executable} snippet.py")]
        else:  # keys: the command whose JSON the block shows
            commands = [Command(snip.target)]
        for cmd in commands:
            res = self._run(cmd.text, box)
            if res is None:
                out.failure = f"timed out after {TIMEOUT} s: {cmd.text}"
                return
            out.results.append((cmd, res))

    def _run(self, command: str, cwd: Path) -> subprocess.CompletedProcess[str] | None:
        with self._lock:
            if self._closed:
                return None
            proc = subprocess.Popen(
                ["bash", "-c", command], cwd=cwd, env=self.env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, start_new_session=True,
            )  # fmt: skip
            self._live.add(proc)
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            reap(proc, None)
            reap_tokens([j.parent for j in cwd.rglob("journal.jsonl")])
            return None
        finally:
            with self._lock:
                self._live.discard(proc)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # nothing a command started outlives it
        return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _env(base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(HF_HUB_OFFLINE="1", MPLBACKEND="Agg", PYTHONPATH=str(REPO))
    return env
