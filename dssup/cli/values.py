"""Every value typed on the command line is checked here, once, before any command does work.

Why one layer: a value that reaches the memory model or the supervisor unchecked fails there
with whatever the arithmetic raises (``--tp 0``: ZeroDivisionError) or, worse, is accepted
(``--gpus 0``, ``--seq-len 99999999999999999999``, ``--gpu-memory 80TB``). Each option of every
command takes one of the types below; a value outside its range gets one line naming the flag,
what is wrong and the fix (``dssup: error: --tp: 0 is out of range; use a whole number from 1
to 65536``), exit 2, from ``app.py``. Cross-field rules (TP dividing the heads, a global batch
divisible by micro-batch x DP) stay with the model that knows them (``dssup.memory.validate``).

The bounds are wide enough for any real job (65,536-way parallelism, 16 M GPUs, 16 M-token
sequences) and tight enough that no accepted value makes the arithmetic overflow or a search
run for hours. A GPU's memory above 1 TiB is refused unless ``--force-gpu-memory`` says it is
meant (no GPU has that much; ``80TB`` is a typo for ``80GB`` far more often than a new GPU).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from dssup.errors import ConfigError
from dssup.memory.gpus import parse_size
from dssup.memory.sizes import parse_bytes

__all__ = [
    "BATCH",
    "COUNT",
    "DEGREE",
    "GPUS",
    "LAYERS",
    "MAX_GPU_MEMORY",
    "NODE_RANK",
    "PORT",
    "SECONDS",
    "SEQ_LEN",
    "TRACE_SEQ_LEN",
    "Bad",
    "Choice",
    "Existing",
    "Place",
    "Real",
    "Size",
    "Whole",
    "force_gpu_memory_option",
]

F = TypeVar("F", bound=Callable[..., Any])
MAX_GPU_MEMORY = 1 << 40  # 1 TiB: above any GPU made; more needs --force-gpu-memory
_MAX_HOST = 1 << 50  # 1 PiB per node
_MAX_BUFFER = 1 << 40
_MAX_BODY = 1 << 30


class Bad(click.BadParameter):
    """A value refused at the edge: what is wrong (``problem``) and what to type (``fix``).
    ``app.py`` prints it as ``--flag: problem; fix``."""

    def __init__(self, problem: str, fix: str, param: click.Parameter | None = None) -> None:
        super().__init__(problem, param=param)
        self.problem, self.fix = problem, fix


def _shown(value: Any) -> str:
    text = str(value)
    return repr(text[:40] + "...") if len(text) > 40 else repr(text)


class Whole(click.ParamType):  # type: ignore[type-arg]
    """A whole number in ``[lo, hi]``; ``1e3``, ``2.5``, ``nan`` and 40-digit numbers are not."""

    name = "integer"

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "INTEGER"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        fix = f"use a whole number from {self.lo} to {self.hi}"
        if isinstance(value, bool):
            raise Bad(f"{value!r} is not a whole number", fix, param)
        if isinstance(value, int):
            number = value
        else:
            text = str(value).strip()
            if not re.fullmatch(r"[+-]?[0-9]{1,30}", text):
                raise Bad(f"{_shown(value)} is not a whole number", fix, param)
            number = int(text)
        if not self.lo <= number <= self.hi:
            raise Bad(f"{number} is out of range", fix, param)
        return number


class Real(click.ParamType):  # type: ignore[type-arg]
    """A finite number in a range; ``lo_open``/``hi_open`` exclude the end itself."""

    name = "float"

    def __init__(
        self, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
    ) -> None:
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "FLOAT"

    def _range(self) -> str:
        lo = f"above {self.lo:g}" if self.lo_open else f"from {self.lo:g}"
        hi = f"below {self.hi:g}" if self.hi_open else f"up to {self.hi:g}"
        return f"use a number {lo} {hi}"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        text = str(value).strip()
        if len(text) > 40 or not re.fullmatch(
            r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text
        ):
            raise Bad(f"{_shown(value)} is not a number", self._range(), param)
        number = float(text)
        low = number <= self.lo if self.lo_open else number < self.lo
        high = number >= self.hi if self.hi_open else number > self.hi
        if not math.isfinite(number) or low or high:
            raise Bad(f"{text} is out of range", self._range(), param)
        return number


class Size(click.ParamType):  # type: ignore[type-arg]
    """A memory amount with its unit, checked and passed on as typed (the commands read GPU
    names from the text). ``kind``: ``gpu`` (a size or a GPU name; at most 1 TiB unless
    ``--force-gpu-memory``), ``host`` (per node), ``buffer`` (0 allowed), ``bytes`` (a bare
    number is bytes)."""

    name = "size"

    def __init__(self, kind: str, many: bool = False) -> None:
        self.kind, self.many = kind, many

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        one = "GPU|SIZE" if self.kind == "gpu" else "SIZE"
        return f"{one}[,...]" if self.many else one

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        parts = [p.strip() for p in text.split(",")] if self.many else [text]
        if not all(parts):
            raise Bad(
                f"{_shown(value)} has an empty item", "separate sizes or GPU names by commas", param
            )
        for part in parts:
            self._one(part, param, ctx)
        return text

    def _one(self, text: str, param: click.Parameter | None, ctx: click.Context | None) -> None:
        flag = _flag(param)
        try:
            if self.kind == "bytes":
                size, cap = parse_bytes(text, flag), _MAX_BODY
            else:
                gpu = self.kind == "gpu"
                size = parse_size(text, flag, gpu=gpu, zero=self.kind == "buffer")
                cap = {"gpu": MAX_GPU_MEMORY, "host": _MAX_HOST}.get(self.kind, _MAX_BUFFER)
        except ConfigError as exc:
            raise Bad(exc.problem, exc.fix, param) from None
        forced = ctx is not None and bool(ctx.params.get("force_gpu_memory"))
        if size > cap and not (self.kind == "gpu" and forced):
            raise Bad(*_too_big(text, self.kind, cap), param)


def _too_big(text: str, kind: str, cap: int) -> tuple[str, str]:
    if kind == "gpu":
        return (
            f"{text} is more than any GPU has (over 1 TiB)",
            "give the memory of one GPU, e.g. 80GiB or H100; add --force-gpu-memory if you mean it",
        )
    return f"{text} is over the largest accepted ({cap >> 40} TiB)", "check the unit"


class Place(click.ParamType):  # type: ignore[type-arg]
    """Where a command writes: a file (``kind="file"``: its folder exists, it is not a folder)
    or a folder (``kind="dir"``: it or its nearest existing parent is a writable folder).
    Checked before the work, so a long run never ends unable to save what it made."""

    name = "path"

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "FILE" if self.kind == "file" else "DIR"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        if isinstance(value, Path):
            value = str(value)
        text = str(value)
        fix = "give a file in an existing folder" if self.kind == "file" else "give a folder"
        if not text.strip() or "\x00" in text or len(text) > 4096:
            raise Bad(f"{_shown(value)} is not a path", fix, param)
        path = Path(text)
        if any(len(part.encode()) > 255 for part in path.parts):
            raise Bad(f"{_shown(value)} has a name longer than 255 bytes", fix, param)
        try:
            return self._checked(path, text, fix, param)
        except OSError as exc:
            raise Bad(f"{text} cannot be used ({exc.strerror})", fix, param) from None

    def _checked(self, path: Path, text: str, fix: str, param: click.Parameter | None) -> Path:
        if self.kind == "file":
            if path.is_dir():
                raise Bad(f"{text} is a folder", fix, param)
            if path.exists() and not path.is_file():  # a device, FIFO or socket: an atomic
                # write would replace the node itself (``/dev/null`` as a PNG)
                raise Bad(f"{text} is not a regular file", fix, param)
            parent = path.parent
            if not parent.is_dir():
                raise Bad(f"folder {parent} does not exist", f"create it or {fix}", param)
        else:
            if path.exists() and not path.is_dir():
                raise Bad(f"{text} exists and is not a folder", fix, param)
            parent = next(p for p in (path, *path.parents) if p.exists())
            if not parent.is_dir():
                raise Bad(f"{parent} is not a folder", fix, param)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise Bad(f"{parent} is not writable", f"{fix} you can write to", param)
        return path


class Existing(click.ParamType):  # type: ignore[type-arg]
    """A file or folder that must exist already (``kind``: ``file``, ``dir``, ``any``); a name
    the filesystem cannot look up (NUL byte, too long) is refused like a missing one."""

    name = "path"

    def __init__(self, kind: str = "file") -> None:
        self.kind = kind

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return {"file": "FILE", "dir": "DIR"}.get(self.kind, "PATH")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        text = str(value)
        what = {"file": "a file", "dir": "a folder"}.get(self.kind, "a file or folder")
        try:
            path = Path(text)
            ok = (
                path.is_file()
                if self.kind == "file"
                else path.is_dir()
                if self.kind == "dir"
                else path.exists()
            )
        except (OSError, ValueError):
            ok = False
        if not text.strip() or not ok:
            raise Bad(
                f"{_shown(value)} is not {what} that exists", f"give {what} that exists", param
            )
        return path


class Choice(click.Choice):  # type: ignore[type-arg]
    """``click.Choice`` whose refusal is one line naming the choices."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            raise Bad(
                f"{_shown(value)} is not a choice",
                f"use one of {', '.join(map(str, self.choices))}",
                param,
            ) from None


def _flag(param: click.Parameter | None) -> str:
    if param is None or not param.opts:
        return "value"
    return max(param.opts, key=len)


def force_gpu_memory_option(fn: F) -> F:
    """``--force-gpu-memory``: accept a ``--gpu-memory`` above 1 TiB. Eager, so the size
    check reads it whatever the order on the command line."""
    return click.option(
        "--force-gpu-memory",
        is_flag=True,
        is_eager=True,
        help="Accept a --gpu-memory above 1 TiB (no GPU has that much; refused otherwise).",
    )(fn)


# The ranges every command shares (a flag of the same meaning has the same bounds everywhere).
DEGREE = Whole(1, 65536)  # a parallel size: TP, PP, EP, CP, DP, VPP, ranks per node
GPUS = Whole(1, 1 << 24)  # GPUs in a job
BATCH = Whole(1, 1 << 24)  # sequences: micro-batch, global batch; micro-batches per step
SEQ_LEN = Whole(1, 1 << 24)  # tokens per sequence
TRACE_SEQ_LEN = Whole(2, 1 << 24)  # a traced or measured step: a next-token loss needs 2
LAYERS = Whole(1, 4096)  # a layer-count override
COUNT = Whole(1, 100_000)  # attempts, retries, steps, rows
NODE_RANK = Whole(0, 1 << 20)
PORT = Whole(1, 65535)
SECONDS = Real(0.0, 7 * 86400.0)  # waits and timeouts: up to a week
