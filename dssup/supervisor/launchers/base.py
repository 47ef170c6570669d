"""What every launcher module provides, and the parsed command they all produce.

dssup wraps the user's own launch command. Each launcher it understands (``torchrun``,
``accelerate launch``, the ``deepspeed`` launcher) is one module with one ``Launcher`` object:
how to recognise the command, its option table (copied from the launcher's own argparse
definition; a test compares the two), where the world size and node rank come from, which
options dssup adds for an attempt (per-rank logs, no restarts of its own), and where the
per-rank logs then are. Everything else in the supervisor sees only ``LaunchCommand``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dssup.errors import ConfigError

__all__ = [
    "FIELD",
    "LaunchCommand",
    "Launcher",
    "OptionTable",
    "RankLog",
    "RankLogSource",
    "World",
    "gpu_count",
    "spellings",
]

FIELD = "the command after --"


@dataclass(frozen=True)
class OptionTable:
    """A launcher's options: canonical name per spelling, and which take a value.

    ``abbrev`` mirrors argparse's ``allow_abbrev``: where it is on, a worker argument that is an
    ambiguous prefix of launcher options makes the launcher abort (argparse scans the whole
    command line before it hands the remainder to the script), so dssup refuses it up front.
    """

    launcher: str
    canon: Mapping[str, str]  # spelling -> canonical name
    takes_value: frozenset[str]  # canonical names that take a value
    abbrev: bool = True

    @classmethod
    def build(
        cls,
        launcher: str,
        values: Mapping[str, Sequence[str]],
        flags: Mapping[str, Sequence[str]],
        abbrev: bool = True,
    ) -> OptionTable:
        canon = {s: n for n, spellings in {**values, **flags}.items() for s in spellings}
        return cls(launcher, canon, frozenset(values), abbrev)

    @classmethod
    def argparse(
        cls,
        launcher: str,
        values: Sequence[str],
        flags: Sequence[str],
        single: set[str],
        short: dict[str, str],
        abbrev: bool = True,
    ) -> OptionTable:
        """The table of an argparse launcher: each name's ``spellings`` (both separators unless
        it is in ``single``, and its short form from ``short``)."""
        return cls.build(
            launcher,
            {n: spellings(n, single, short) for n in values},
            {n: spellings(n, single, short) for n in flags},
            abbrev,
        )

    @property
    def spellings(self) -> frozenset[str]:
        return frozenset(self.canon)

    def parse(self, rest: list[str]) -> tuple[dict[str, str | None], int]:
        """Options before the script: ({canonical name: value or None}, index of the script)."""
        options: dict[str, str | None] = {}
        i = 0
        while i < len(rest):
            tok = rest[i]
            if not tok.startswith("-") or tok == "-":
                break
            name, sep, inline = tok.partition("=")
            canon = self.canon.get(name)
            if canon is None:
                raise ConfigError(
                    FIELD,
                    f"unknown {self.launcher} option {tok!r}",
                    f"check the spelling against `{self.launcher} --help`",
                )
            if canon not in self.takes_value or sep:
                options[canon] = inline if sep else None
                i += 1
                continue
            if i + 1 >= len(rest):
                raise ConfigError(FIELD, f"{self.launcher} option {tok} needs a value", "")
            options[canon] = rest[i + 1]
            i += 2
        return options, i

    def ambiguous(self, args: list[str]) -> list[tuple[str, list[str]]]:
        """Worker arguments the launcher's argparse would reject as ambiguous abbreviations."""
        if not self.abbrev:
            return []
        every = sorted(s for s in self.canon if s.startswith("--"))
        bad = []
        for tok in args:
            if not tok.startswith("--") or tok == "--":
                continue
            name = tok.split("=", 1)[0]
            if name in self.canon:
                continue
            hits = [o for o in every if o.startswith(name)]
            if len(hits) > 1:  # Python 3.11's argparse: two spellings of one option count too
                bad.append((tok, hits))
        return bad


@dataclass(frozen=True)
class World:
    """How many ranks run, and where that figure came from (printed in the hand-off)."""

    nnodes: int
    nproc_per_node: int
    node_rank: int | None
    source: str

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclass(frozen=True)
class RankLog:
    """One rank's files under the attempt's log directory."""

    local_rank: int
    rank: int | None
    output: Path  # stderr (torchrun) or the combined output (deepspeed launcher)
    error_file: Path | None  # torchelastic's error.json (@record), where the launcher has one


class RankLogSource(Protocol):
    """Where the per-rank files of an attempt are (a launcher, or the console of one process)."""

    def rank_logs(self, log_dir: Path) -> dict[int, RankLog]: ...


class Launcher(Protocol):
    """One launcher dssup can wrap (see the module docstring)."""

    name: str
    table: OptionTable
    echo_rank_logs: bool  # rank output goes only to files: dssup copies it to the console

    def match(self, argv: list[str]) -> int | None:
        """Length of the prefix that names this launcher (``torchrun``: 1), or None."""
        ...

    def env_option(self, cmd: LaunchCommand, name: str) -> str | None:
        """An option's value from the environment or a config file, where the launcher reads one."""
        ...

    def world(self, cmd: LaunchCommand) -> World: ...

    def extras(self, cmd: LaunchCommand, attempt_dir: Path) -> list[str]:
        """Launcher options dssup adds for one attempt (only those the user did not set)."""
        ...

    def log_dir(self, cmd: LaunchCommand, attempt_dir: Path) -> Path | None:
        """Where the attempt's per-rank logs go, or None when the launcher keeps none."""
        ...

    def rank_logs(self, log_dir: Path) -> dict[int, RankLog]:
        """The per-rank files of the newest run under ``log_dir``, by local rank."""
        ...


@dataclass
class LaunchCommand:
    """A parsed launch command: launcher options, then the script and its own arguments."""

    launcher: Launcher
    prefix: list[str]  # ["torchrun"], ["accelerate", "launch"], ["python", "-m", "..."]
    launcher_args: list[str]
    script: str
    script_args: list[str]
    options: dict[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.launcher.name

    def option(self, name: str) -> str | None:
        """An option's value from the command, else where the launcher itself would look."""
        if name in self.options:
            return self.options[name]
        return self.launcher.env_option(self, name)

    def has(self, name: str) -> bool:
        return name in self.options or self.option(name) is not None

    @property
    def module(self) -> bool:
        """The script is a module name (``-m``), not a file."""
        return "module" in self.options

    @property
    def no_python(self) -> bool:
        return "no-python" in self.options or "no_python" in self.options

    def world(self) -> World:
        return self.launcher.world(self)

    def world_size(self) -> int:
        return self.world().world_size

    def nnodes(self) -> int:
        return self.world().nnodes

    def nproc_per_node(self) -> int:
        return self.world().nproc_per_node

    def argv(self, extra_launcher: list[str], script_args: list[str] | None = None) -> list[str]:
        """The command to run: the user's launcher options, then dssup's, then the script."""
        args = self.script_args if script_args is None else script_args
        return [*self.prefix, *self.launcher_args, *extra_launcher, self.script, *args]


def spellings(name: str, single: set[str], short: dict[str, str]) -> list[str]:
    """How argparse spells an option: ``--name``, the other separator's form (``--nproc-per-node``
    and ``--nproc_per_node``) unless it has only one, and a short form where there is one."""
    out = [f"--{name}"]
    if name not in single:
        other = name.replace("-", "_") if "-" in name else name.replace("_", "-")
        out.append(f"--{other}")
    if name in short:
        out.append(short[name])
    return out


def gpu_count() -> int:
    """NVIDIA devices this machine shows (``/dev/nvidiaN``), without importing torch."""
    try:
        return len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()])
    except OSError:
        return 0


def parse_int(value: str | None, what: str, fix: str) -> int | None:
    """An integer option value, or a clear refusal naming the option."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(FIELD, f"{what} {value!r} is not a whole number", fix) from exc
