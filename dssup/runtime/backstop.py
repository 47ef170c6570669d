"""When in-process recovery cannot proceed: say why, then leave at once for the supervisor.

Some failures cannot be redone inside the process: an OOM at the finest split, an OOM inside
a collective or in the optimizer step (state half-updated), an OOM in a micro-batch whose
backward was already synchronising, a peer that died or never gave its verdict. Then the
guard, in this order:

1. appends an ``inprocess-gave-up`` record to the job-side report (reason, step, split, the
   ranks that OOMed, its own error), so the supervisor's journal says why;
2. writes the torchelastic error file (``TORCHELASTIC_ERROR_FILE``, the format ``@record``
   writes) with the original error and its traceback, and logs both: dssup's fast fail sees
   the OOM at once and classifies it (kind and phase) as if the worker had died of it;
3. exits with ``GAVE_UP_EXIT`` (75, ``EX_TEMPFAIL``) through ``os._exit``: no ``finally``
   block or atexit hook of the training script can wait on a collective that will never
   complete. torchrun sees the exit within its monitor interval and stops the other ranks;
   ``dssup run`` relaunches with its plan, from the split the job had moved to, from the last
   complete checkpoint.

``on_give_up="raise"`` raises ``InProcessGaveUp`` instead of step 3, for scripts that want to
do something first (and for tests).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass

from dssup.errors import InProcessGaveUpError
from dssup.jobreport import InProcessGaveUp
from dssup.runtime.report import report_record, who

__all__ = ["GAVE_UP_EXIT", "GiveUp", "give_up"]

log = logging.getLogger("dssup.runtime.guard")
GAVE_UP_EXIT = 75


@dataclass(frozen=True)
class GiveUp:
    """Why the guard stops, and the state it stops in."""

    reason: str
    detail: str
    step: int
    micro_batch: int
    grad_accum: int
    dp: int
    global_batch: int
    phase: str = ""
    oom_ranks: tuple[int, ...] = ()
    error: str = ""  # this rank's own error, one line
    traceback: str = ""  # its formatted traceback, when it had one


def _error_file(why: GiveUp) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    if not path or os.path.exists(path):
        return
    message = why.error or f"InProcessGaveUp: {why.reason}: {why.detail}"
    doc = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": why.traceback or message,
                "timestamp": str(int(time.time())),
            },
        },
        "dssup_inprocess": {"reason": why.reason, "detail": why.detail},
    }
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def give_up(why: GiveUp, on_give_up: str) -> None:
    """Record, log, and exit with ``GAVE_UP_EXIT`` (or raise ``InProcessGaveUpError``)."""
    record = InProcessGaveUp(
        **who(),
        source="dssup.runtime.StepGuard",
        step=why.step,
        reason=why.reason,
        detail=why.detail,
        phase=why.phase,
        micro_batch=why.micro_batch,
        grad_accum=why.grad_accum,
        dp=why.dp,
        global_batch=why.global_batch,
        oom_ranks=why.oom_ranks,
        error=why.error,
        exit_code=GAVE_UP_EXIT,
    )
    report_record(record)
    if why.traceback:
        log.error("%s", why.traceback.rstrip())
    then = "raising InProcessGaveUpError" if on_give_up == "raise" else (
        f"exiting with status {GAVE_UP_EXIT} so that the supervisor takes over"
    )  # fmt: skip
    log.error(
        "dssup: in-process recovery gave up at step %s (%s: %s); %s",
        why.step, why.reason, why.detail, then,
    )  # fmt: skip
    if on_give_up == "raise":
        raise InProcessGaveUpError(why.reason, why.detail, record)
    _error_file(why)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(GAVE_UP_EXIT)
