"""Read and rewrite command-line flags inside container ``command``/``args`` lists.

Launch lines come in three shapes: ``["--flag", "value"]``, ``["--flag=value"]`` and shell
scripts (``["bash", "-c", "torchrun ... --flag value"]``). Reading handles all three; writing
edits a private copy of the two lists and turns the difference into JSON Patch operations with
``test`` guards, so a patch never lands on args that another webhook moved in the meantime.
Appending new flags to a shell script is refused (the script's last command is unknown).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dssup.admission.view import ContainerView

__all__ = ["MAX_SCRIPT", "ArgvEditor", "Hit", "find_launch", "list_ops"]

_FIELDS = ("command", "args")
MAX_SCRIPT = 32 << 10  # launch-line elements longer than this are not scanned (bounded time)


@dataclass(frozen=True, slots=True)
class Hit:
    """One occurrence of a flag: its value (None for a bare switch) and where it sits."""

    flag: str
    value: str | None
    field: str  # "command" or "args"
    index: int  # element index of the flag
    form: str  # "sep" | "eq" | "bool" | "script"


def _is_script(elem: str) -> bool:
    return " " in elem or "\n" in elem or "\t" in elem or ";" in elem


@lru_cache(maxsize=1024)
def _split(elem: str) -> tuple[str, ...]:
    """Shell words of a script (cached: the same launch line arrives again and again)."""
    try:
        return tuple(shlex.split(elem, comments=False))
    except ValueError:
        return tuple(elem.split())


def _scan(
    tokens: Sequence[str], names: frozenset[str]
) -> Iterable[tuple[str, str | None, int, str]]:
    for i, tok in enumerate(tokens):
        if not tok.startswith("-"):
            continue
        if "=" in tok:
            key, _, val = tok.partition("=")
            if key in names:
                yield key, val, i, "eq"
        elif tok in names:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is None or (nxt.startswith("--") and not _number(nxt)):
                yield tok, None, i, "bool"
            else:
                yield tok, nxt, i, "sep"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def find_launch(
    command: tuple[str, ...], args: tuple[str, ...], names: frozenset[str]
) -> tuple[Hit, ...]:
    """Every occurrence of any flag in ``names`` in a launch line's command then args (cached;
    the result is shared, hence a tuple)."""
    return _find(command, args, names)


@lru_cache(maxsize=4096)
def _find(
    command: tuple[str, ...], args: tuple[str, ...], names: frozenset[str]
) -> tuple[Hit, ...]:
    """Cached: replicated pod templates and resubmitted jobs repeat the same launch line."""
    hits: list[Hit] = []
    for fname, items in (("command", command), ("args", args)):
        for key, val, i, form in _scan(items, names):
            hits.append(Hit(key, val, fname, i, form))
        for i, elem in enumerate(items):
            if len(elem) > MAX_SCRIPT:
                continue
            if _is_script(elem) and any(n in elem for n in names):
                for key, val, _, _ in _scan(_split(elem), names):
                    hits.append(Hit(key, val, fname, i, "script"))
    return tuple(hits)


def list_ops(
    path: str, old: Sequence[str], new: Sequence[str], present: bool
) -> list[dict[str, Any]]:
    """Guarded JSON Patch operations turning list ``old`` at ``path`` into ``new``."""
    if list(old) == list(new):
        return []
    if not present:
        return [{"op": "add", "path": path, "value": list(new)}]
    if len(old) != len(new):
        return [
            {"op": "test", "path": path, "value": list(old)},
            {"op": "replace", "path": path, "value": list(new)},
        ]
    ops: list[dict[str, Any]] = []
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        if a != b:
            ops.append({"op": "test", "path": f"{path}/{i}", "value": a})
            ops.append({"op": "replace", "path": f"{path}/{i}", "value": b})
    return ops


def _replacer(flag: str, value: str) -> Callable[[re.Match[str]], str]:
    return lambda m: f"{flag}{m.group(1)}{value}"


class ArgvEditor:
    """A private copy of one container's command and args that records edits."""

    def __init__(self, container: ContainerView) -> None:
        self.container = container
        self.lists = {"command": list(container.command), "args": list(container.args)}

    def set(self, names: frozenset[str], value: str) -> bool:
        """Give every occurrence of the flags the new value. False when none exists."""
        found = False
        for hit in find_lists(self.lists, names):
            items = self.lists[hit.field]
            if hit.form == "sep":
                items[hit.index + 1] = value
            elif hit.form == "eq":
                items[hit.index] = f"{hit.flag}={value}"
            elif hit.form == "script":
                pattern = rf"(?<!\S){re.escape(hit.flag)}(=|\s+)(?!--)\S+"
                items[hit.index] = re.sub(pattern, _replacer(hit.flag, value), items[hit.index])
            else:
                continue
            found = True
        return found

    def remove(self, names: frozenset[str]) -> bool:
        """Drop bare switches (e.g. ``--gradient_checkpointing``). False if one is in a script."""
        for hit in sorted(find_lists(self.lists, names), key=lambda h: -h.index):
            items = self.lists[hit.field]
            if hit.form in {"bool", "eq"}:
                del items[hit.index]
            elif hit.form == "sep":
                del items[hit.index : hit.index + 2]
            else:
                return False
        return True

    def append(self, tokens: Sequence[str]) -> bool:
        """Append flags to the launcher's list; refused when the launch line is a script."""
        field = "args" if self.lists["args"] or not self.lists["command"] else "command"
        items = self.lists[field]
        if any(_is_script(e) for e in items) or not items:
            return False
        items.extend(tokens)
        return True

    def ops(self) -> list[dict[str, Any]]:
        c = self.container
        return list_ops(
            c.command_path, c.command, self.lists["command"], c.command_present
        ) + list_ops(c.args_path, c.args, self.lists["args"], c.args_present)


def find_lists(lists: dict[str, list[str]], names: frozenset[str]) -> list[Hit]:
    """``find_launch`` over an editor's working lists."""
    return list(find_launch(tuple(lists["command"]), tuple(lists["args"]), names))
