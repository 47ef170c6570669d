"""Docs are tests: every command and code block of README.md and docs/*.md, and every example of
every ``--help``, read into runnable snippets.

The rules a doc follows (docs/testing.md, "Docs are tests"):

* A fenced block with no language, ``bash``, ``sh`` or ``console`` holds commands. In a block
  whose lines start with ``$ ``, those are the commands and the lines after each are its
  output: every shown line (``...`` elides) must appear in what the command prints. Elsewhere
  every line is a command; a line ending in ``\\`` continues on the next.
* A command ends with ``# exit N`` when it shows an error or a verdict of exit status N (the
  default is 0); any other trailing ``# ...`` is a comment.
* ``python`` blocks run as scripts; ``json`` and ``yaml`` blocks must parse; ``text`` blocks
  are output or formulas and are not run.
* An HTML comment on the line before a fence says more, e.g.
  ``<!-- doc: skip needs a Kubernetes cluster -->`` (not run, and the reason is listed by the
  tests), ``<!-- doc: fragment -->`` (Python that names the reader's own objects: compiled and
  its imports run), ``<!-- doc: synopsis dssup webhook serve -->`` (every flag it shows must be
  one of that command's), ``<!-- doc: keys dssup estimate ARGS -->`` (every ``"key":`` the
  block shows must be in that command's JSON output).
* An inline ``dssup ...`` span names a command in prose: the command and its flags must
  exist (a complete example belongs in a fenced block, where it runs).
* A ``--help`` line starting with ``dssup `` is an example and is run the same way.

Commands run in a sandbox folder per document (the repository's folders linked in, so
``examples/...`` paths work as written), in document order, with the project's venv first on
PATH.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Command", "Snippet", "help_snippets", "inline_snippets", "markdown_snippets"]

REPO = Path(__file__).resolve().parents[2]
SHELL = {"", "bash", "sh", "console", "shell"}
_EXIT = re.compile(r"\s#\s*exit\s+(\d+)\b.*$")
_COMMENT = re.compile(r"\s#\s.*$")
_DIRECTIVE = re.compile(r"<!--\s*doc:\s*(\w+)\s*(.*?)\s*-->")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


@dataclass
class Command:
    """One command line as a user types it."""

    text: str
    exit: int = 0
    expect: list[str] = field(default_factory=list)


@dataclass
class Snippet:
    """A block (or inline span, or help example) and what checking it means."""

    where: str  # file:line
    kind: str  # shell, python, json, yaml, text, synopsis, keys, flags
    text: str
    commands: list[Command] = field(default_factory=list)
    skip: str = ""
    fragment: bool = False
    target: str = ""  # synopsis/keys: the command whose flags or JSON are meant
    box: str = ""  # the sandbox it runs in (default: its document's)

    @property
    def doc(self) -> str:
        return self.box or self.where.rsplit(":", 1)[0]


def _logical_lines(text: str) -> list[str]:
    out: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        out.append((buf + line.strip()) if buf else line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def command_of(line: str) -> Command:
    """A command line with its ``# exit N`` marker read and comments removed."""
    code = 0
    found = _EXIT.search(line)
    if found:
        code = int(found.group(1))
        line = line[: found.start()]
    elif " #" in line:  # a trailing comment, not a # inside quotes
        try:
            shlex.split(line, comments=False)
            line = _COMMENT.sub("", line)
        except ValueError:
            pass
    return Command(line.strip(), code)


def shell_commands(text: str) -> list[Command]:
    lines = _logical_lines(text)
    if any(line.startswith("$ ") for line in lines):
        out: list[Command] = []
        for line in lines:
            if line.startswith("$ "):
                out.append(command_of(line[2:]))
            elif out and line.strip():
                out[-1].expect.append(line)
        return out
    return [command_of(line) for line in lines if line.strip() and not line.strip().startswith("#")]


def markdown_snippets(path: Path) -> list[Snippet]:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(REPO)
    out: list[Snippet] = []
    for m in _FENCE.finditer(text):
        lang, body = m.group(1).lower(), m.group(2)
        line_no = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip().rsplit("\n", 1)[-1]
        directive = _DIRECTIVE.search(before)
        verb, arg = (directive.group(1), directive.group(2)) if directive else ("", "")
        snip = Snippet(f"{rel}:{line_no}", "text", body)
        if verb == "skip":
            snip.skip = arg or "no reason given"
        if lang in SHELL:
            snip.kind = "shell"
            snip.commands = shell_commands(body)
        elif lang in ("python", "json", "yaml", "text"):
            snip.kind = lang
        else:
            snip.kind = "text"
        if verb == "fragment":
            snip.fragment = True
        elif verb in ("synopsis", "keys"):
            snip.kind, snip.target = verb, arg
        out.append(snip)
    return out


def inline_snippets(path: Path) -> list[Snippet]:
    """Inline ``dssup ...`` spans outside fences: their command and flags must exist."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(REPO)
    fenced = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    out: list[Snippet] = []
    for m in re.finditer(r"`(dssup(?: [^`]+)?)`", text):
        if any(a <= m.start() < b for a, b in fenced):
            continue
        span = " ".join(m.group(1).split())
        line_no = text.count("\n", 0, m.start()) + 1
        out.append(Snippet(f"{rel}:{line_no}", "flags", span, target=span))
    return out


def help_examples(help_text: str, commands: set[str]) -> list[Command]:
    """The example lines of one ``--help`` text: ``dssup <command> ...`` lines."""
    lines = _logical_lines("\n".join(line.strip() for line in help_text.splitlines()))
    return [
        command_of(line)
        for line in lines
        if line.startswith("dssup ") and line.split()[1:2] and line.split()[1] in commands
    ]


def help_snippets(helps: dict[str, str], commands: set[str]) -> list[Snippet]:
    """``helps``: command path -> its ``--help`` text; ``commands``: dssup's command names."""
    out: list[Snippet] = []
    for path, text in sorted(helps.items()):
        for i, cmd in enumerate(help_examples(text, commands)):
            # one sandbox for every help: `dssup status` tells the run `dssup run` made
            out.append(Snippet(f"{path} --help:{i + 1}", "shell", cmd.text, [cmd], box="--help"))
    return out
