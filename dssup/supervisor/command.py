"""Understand the user's launch command without importing torch: which launcher, its options,
the script and the script's own arguments.

Each launcher dssup understands is one module under ``dssup.supervisor.launchers`` (its option
table copied from its own argparse definition and tested against it, where the world size and
node rank come from, which options dssup adds per attempt, where per-rank logs go). This module
only picks the launcher and splits the command; a command it does not recognise, an unknown
launcher option, or a worker argument the launcher's argparse would read as an ambiguous
abbreviation of its own options (it would abort with exit 2) is refused up front, by name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dssup.errors import ConfigError
from dssup.supervisor.launchers import ACCELERATE, DEEPSPEED, TORCHRUN
from dssup.supervisor.launchers.base import FIELD, LaunchCommand, Launcher
from dssup.supervisor.launchers.torchrun import TORCHRUN_FLAGS, TORCHRUN_OPTIONS

__all__ = [
    "LAUNCHERS",
    "TORCHRUN_FLAGS",
    "TORCHRUN_OPTIONS",
    "LaunchCommand",
    "ambiguous_prefixes",
    "parse_command",
]

LAUNCHERS: tuple[Launcher, ...] = (TORCHRUN, ACCELERATE, DEEPSPEED)
_FORMS = (
    "-- torchrun [options] train.py [args] (or python -m torch.distributed.run), "
    "-- accelerate launch --multi_gpu --num_processes N train.py [args], "
    "or -- deepspeed --num_gpus N train.py [args]"
)


def ambiguous_prefixes(args: list[str]) -> list[tuple[str, list[str]]]:
    """Worker arguments torchrun's argparse would reject as ambiguous abbreviations."""
    return TORCHRUN.table.ambiguous(args)


def _launcher(argv: list[str]) -> tuple[Launcher, int]:
    for launcher in LAUNCHERS:
        length = launcher.match(argv)
        if length is not None:
            return launcher, length
    raise ConfigError(
        FIELD,
        f"{argv[0]!r} is not torchrun, accelerate launch or the deepspeed launcher",
        f"wrap a launch command: {_FORMS}",
    )


def parse_command(argv: list[str], env: Mapping[str, str] | None = None) -> LaunchCommand:
    """Split a launch command into launcher options and the worker script with its args."""
    if not argv:
        raise ConfigError(FIELD, "no command given", f"add one: {_FORMS}")
    launcher, length = _launcher(list(argv))
    prefix, rest = list(argv[:length]), list(argv[length:])
    options, i = launcher.table.parse(rest)
    if i >= len(rest):
        raise ConfigError(FIELD, "no training script in the command", "add train.py")
    script, script_args = rest[i], rest[i + 1 :]
    if bad := launcher.table.ambiguous(script_args):
        tok, hits = bad[0]
        raise ConfigError(
            FIELD,
            f"worker argument {tok!r} is an ambiguous prefix of {launcher.name} options "
            f"({', '.join(hits[:4])}); {launcher.name} would abort with exit 2",
            "spell the worker option out in full",
        )
    cmd = LaunchCommand(
        launcher, prefix, rest[:i], script, script_args, options, dict(env or os.environ)
    )
    cmd.world()  # a world size dssup cannot work out is refused now, not after a launch
    return cmd
