"""From an attempt's evidence to one verdict: which rank failed first, of what, and why we think so.

Each failed rank is classified on its own (signature table on the error file's message, then
on the stderr tail; exit code and signal; the phase read from the traceback), then the root
cause is chosen: cascades (a peer's closed connection, a watchdog abort, a SIGTERM sent by
torchrun while stopping the others) never win over a rank that failed on its own; among the
rest, a specific verdict (OOM, user error) wins over an unknown one, then the earliest time.
A worker that aborts after every rank reported completion is a teardown, not a failure.
"""

from __future__ import annotations

import signal as _signal

from dssup.supervisor.evidence import AttemptEvidence, RankEvidence
from dssup.supervisor.models import Failure, FailureKind, RankFailure
from dssup.supervisor.signatures import match, parse_oom_numbers
from dssup.supervisor.text import clip
from dssup.supervisor.tracebacks import last_exception

__all__ = ["classify", "classify_rank", "phase_of"]

K = FailureKind
_LOAD_MARKERS = (
    "load_checkpoint",
    "state_dict_loader",
    "torch/serialization.py",
    "load_state_dict",
    "set_state_dict",
    "dcp.load",
    "from_pretrained",
    "load_universal",
)
# Writing a checkpoint: torch.save, DCP, safetensors, HF Trainer's and DeepSpeed's save paths.
# Function names only: a load passes through the same files (torch/serialization.py, safetensors).
_SAVE_MARKERS = (
    "in save_checkpoint\n",
    "in _save_checkpoint\n",
    "in save_model\n",
    "in save_file\n",
    "in save\n",
    "in _save\n",
    "state_dict_saver",
)
# torch optimizers, and DeepSpeed's engine.step (ZeRO's gradient flattening, the fp32 cast and
# the parameter all-gather run there, outside torch/optim).
_OPTIMIZER_MARKERS = ("optimizer.py", "optim/", "_take_model_step")
_PRIORITY = {
    K.USER_ERROR: 0,
    K.LOAD_OOM: 0,
    K.CUDA_OOM: 0,
    K.HOST_OOM: 0,
    K.COMM_OOM: 0,
    K.COMM: 1,
    K.TRANSIENT: 2,
    K.TEARDOWN: 3,
    K.UNVERIFIED_END: 3,
    K.INTERRUPTED: 3,
    K.BATCH_MISMATCH: 3,
}


def phase_of(callstack: str) -> str:
    """Where in training the failure happened, read from the Python traceback."""
    if not callstack:
        return ""
    if any(m in callstack + "\n" for m in _SAVE_MARKERS):
        return "save"
    if any(m in callstack for m in _LOAD_MARKERS):
        return "load"
    last = callstack.strip().splitlines()[-12:]
    tail = "\n".join(last)
    if "all_reduce" in tail or "distributed_c10d" in tail or "_sync_buffers" in tail:
        return "comm"
    if "backward" in callstack:
        return "backward"
    if any(m in callstack for m in _OPTIMIZER_MARKERS):
        return "optimizer"
    return "forward"


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return ""
    try:
        return _signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def classify_rank(ev: RankEvidence, oom_kills: int = 0) -> RankFailure:
    """One rank's verdict from its message, stderr tail and exit code."""
    text = ev.message or last_exception(ev.stderr_tail)
    sig = match(text) if text else None
    if sig is None and ev.stderr_tail:
        sig = match(ev.stderr_tail)
    phase = phase_of(ev.callstack)
    common = {
        "rank": ev.rank,
        "local_rank": ev.local_rank,
        "exit_code": ev.exit_code,
        "message": clip(text, 500),
        "timestamp": ev.timestamp,
        "phase": phase,
        "sources": tuple(ev.sources),
    }
    if sig is not None and not (sig.cascade and ev.exit_code == -_signal.SIGKILL):
        kind = sig.kind
        if kind.is_oom and phase == "load":
            kind = K.LOAD_OOM
        elif kind in {K.CUDA_OOM, K.HOST_OOM} and phase == "comm":
            kind = K.COMM_OOM
        elif kind == K.COMM_OOM and sig.name == "comm-bad-alloc" and phase not in {"", "comm"}:
            kind = K.HOST_OOM  # a C++ allocation in a save or a load, not a collective's buffer
        return RankFailure(kind=kind, cascade=sig.cascade, signature=sig.name, **common)
    if ev.exit_code == -_signal.SIGKILL:
        if oom_kills > 0:
            return RankFailure(kind=K.HOST_OOM, signature="oom-killer", **common)
        return RankFailure(kind=K.TRANSIENT, signature="sigkill", **common)
    if ev.exit_code == -_signal.SIGTERM:
        return RankFailure(kind=K.COMM, cascade=True, signature="stopped-by-agent", **common)
    if ev.exit_code == -_signal.SIGABRT and "without an active exception" in ev.stderr_tail:
        # the exit flake: a teardown only if every rank reported completion (see classify)
        return RankFailure(kind=K.TRANSIENT, signature="abort-without-exception", **common)
    return RankFailure(
        kind=K.TRANSIENT, signature=_signal_name(ev.exit_code) or "unknown", **common
    )


_DYING = frozenset({"error-file", "uncaught-traceback", "fatal-message", "live-stderr"})


def _failed(ev: RankEvidence) -> bool:
    """A rank failed: a non-zero exit, an error file, or output that shows it dying."""
    return (ev.exit_code not in (None, 0)) or bool(_DYING & set(ev.sources))


def _choose(ranks: list[RankFailure]) -> RankFailure:
    own = [r for r in ranks if not r.cascade] or ranks
    return min(own, key=lambda r: (_PRIORITY[r.kind], r.timestamp or 1 << 62, r.rank or 0))


def classify(ev: AttemptEvidence) -> Failure | None:
    """The attempt's root cause, or None when it succeeded."""
    if ev.exit_code == 0:
        return None
    ranks = [classify_rank(r, ev.oom_kills) for r in ev.ranks.values() if _failed(r)]
    evidence = [f"torchrun exited {ev.exit_code}"]
    if ev.oom_kills:
        evidence.append(f"OOM killer fired {ev.oom_kills} time(s) in our cgroup subtree")
    if ev.done_ranks and len(ev.done_ranks) >= ev.world_size:
        evidence.append(f"all {ev.world_size} ranks reported completion before the failure")
        return Failure(
            kind=K.TEARDOWN,
            exit_code=ev.exit_code,
            ranks=tuple(ranks),
            message="a worker failed after training completed",
            evidence=tuple(evidence),
        )
    if not ranks:
        return _launcher_failure(ev, evidence)
    root = _choose(ranks)
    for r in ranks:
        role = "cascade" if r.cascade else ("root cause" if r is root else "also failed")
        evidence.append(
            f"rank {r.rank}: {r.kind} via {r.signature} ({role}): {clip(r.message, 160)}"
        )
    kind = root.kind if not root.cascade else K.COMM
    if root.cascade:
        evidence.append("every failed rank only reports another's failure: root cause unseen")
    numbers = parse_oom_numbers(root.message) if kind.is_oom else {}
    return Failure(
        kind=kind,
        rank=root.rank,
        exit_code=ev.exit_code,
        signal=-root.exit_code if root.exit_code and root.exit_code < 0 else None,
        message=root.message,
        signature=root.signature,
        phase=root.phase,
        ranks=tuple(ranks),
        evidence=tuple(evidence),
        **numbers,
    )


def _launcher_failure(ev: AttemptEvidence, evidence: list[str]) -> Failure:
    """torchrun failed with no failed worker on record (bad arguments, rendezvous)."""
    text = last_exception(ev.console_tail) or ev.console_tail.strip().splitlines()[-1:][0:1]
    message = text if isinstance(text, str) else " ".join(text)
    sig = match(ev.console_tail)
    if ev.exit_code == 2 and "usage:" in ev.console_tail:
        return Failure(
            kind=K.USER_ERROR,
            exit_code=2,
            message=message,
            signature="torchrun-usage",
            evidence=(*evidence, "torchrun rejected its arguments"),
        )
    kind = sig.kind if sig is not None and not sig.cascade else K.TRANSIENT
    if ev.exit_code < 0:
        evidence.append(f"torchrun itself was killed by {_signal_name(ev.exit_code)}")
    return Failure(
        kind=kind,
        exit_code=ev.exit_code,
        message=message,
        signature=sig.name if sig else "launcher",
        evidence=tuple(evidence),
    )
