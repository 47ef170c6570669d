"""Python tracebacks read back from a rank's output, for scripts without ``@record``.

torchelastic's ``@record`` writes the failing exception and its call stack to an error file;
most scripts (every stock Hugging Face example) do not use it. Their traceback still reaches the
rank's stderr: the frames, then the exception line, printed before the process starts its slow
unwinding. This module finds the last traceback in such text, the exception it ends with, and
whether it propagated out of the script (its outermost frame is the script's ``<module>``, or
runpy's for ``-m``): a traceback a script logged and survived starts deeper.

Launcher prefixes (``[default1]:`` from torchrun's ``--tee``, ``[rank1]:`` from torch) are
stripped first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["EXCEPTION_LINE", "PyTraceback", "last_exception", "last_traceback", "strip_prefixes"]

_PREFIX = re.compile(r"^(?:\[(?:default|rank)\d+\]:\s?)+", re.MULTILINE)
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b(?::.*)?)$")
_START = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "([^"]+)", line \d+, in (\S+)')
_OUTERMOST = {"<module>", "_run_module_as_main", "_run_code"}


def strip_prefixes(text: str) -> str:
    return _PREFIX.sub("", text)


def last_exception(text: str) -> str:
    """The last ``SomethingError: ...`` line (prefixes stripped), or ''."""
    for line in reversed(strip_prefixes(text).splitlines()):
        if m := EXCEPTION_LINE.match(line.strip()):
            return m.group(1).strip()
    return ""


@dataclass(frozen=True)
class PyTraceback:
    callstack: str  # the frames, "Traceback ..." through the line before the exception
    exception: str  # "RuntimeError: ..." (the whole last line)
    uncaught: bool  # the outermost frame is the script's top level: the process is dying


def last_traceback(text: str) -> PyTraceback | None:
    """The last complete traceback in ``text`` (one that ends with its exception line)."""
    lines = strip_prefixes(text).splitlines()
    start = max((i for i, ln in enumerate(lines) if ln.strip() == _START), default=None)
    if start is None:
        return None
    for end in range(start + 1, len(lines)):
        line = lines[end]
        if line and not line[0].isspace() and (m := EXCEPTION_LINE.match(line.strip())):
            frames = lines[start:end]
            first = next((f for ln in frames if (f := _FRAME.match(ln))), None)
            uncaught = first is not None and first.group(2) in _OUTERMOST
            return PyTraceback("\n".join(frames), m.group(1).strip(), uncaught)
    return None
