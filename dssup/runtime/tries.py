"""One try of a step, as the step guard keeps it: what failed and where, and nothing more.

An OOM's traceback references the frames of the failed forward or backward, and through them
the micro-batch's activations; keeping the exception would keep that memory alive through the
redo. So ``caught`` keeps only text (the message, the formatted traceback for the supervisor)
for an OOM; any other exception is kept whole, to be re-raised once the peers know. The RNG
helpers capture and restore the CPU (and, when initialised, CUDA) generators, so a redone step
draws the same random numbers from the same starting point.
"""

from __future__ import annotations

import gc
import traceback
from dataclasses import dataclass
from typing import Any

from dssup.runtime.agree import Code
from dssup.runtime.oom import is_oom, oom_text

__all__ = ["Try", "caught", "free_memory", "phase_code", "rng_state", "set_rng"]


@dataclass
class Try:
    code: Code = Code.OK
    error: str = ""
    traceback: str = ""
    exc: BaseException | None = None  # a non-OOM error, re-raised after the verdict
    verdicts: tuple[Code, ...] = ()  # every rank's, once exchanged


def caught(exc: BaseException, code: Code) -> Try:
    """What to keep of a failed micro-batch (see the module docstring)."""
    if not is_oom(exc):
        return Try(Code.ERROR, oom_text(exc), exc=exc)
    return Try(code, oom_text(exc), "".join(traceback.format_exception(exc)))


def phase_code(exc: BaseException) -> Code:
    """``OOM_BACKWARD`` when the exception passed through autograd's backward, else forward."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "backward" or "autograd" in code.co_filename:
            return Code.OOM_BACKWARD
        tb = tb.tb_next
    return Code.OOM_FORWARD


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()


def rng_state() -> tuple[Any, Any]:
    import torch

    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        cuda = torch.cuda.get_rng_state_all()
    return torch.get_rng_state(), cuda


def set_rng(state: tuple[Any, Any]) -> None:
    import torch

    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])
