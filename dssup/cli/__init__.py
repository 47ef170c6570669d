"""The ``dssup`` command: the only module that knows every layer and owns exit codes.

Each sub-command lives in its own module of this package and registers itself on ``main``;
``main`` itself only sets up logging and maps ``DssupError`` to one-line messages (exit 2 for
bad input), so no command ever shows a traceback for a user mistake.
"""

from __future__ import annotations

import importlib

from dssup.cli.app import main

__all__ = ["main"]

# Sub-command modules; each adds itself to ``main`` on import.
for _name in (
    "estimate",
    "models",
    "plan",
    "demo",
    "run",
    "status",
    "webhook",
    "admit",
    "measure",
    "calibrate",
    "elastic",
    "gpus",
):
    try:
        importlib.import_module(f"dssup.cli.{_name}")
    except ModuleNotFoundError as exc:  # a command whose module is not written yet
        if exc.name != f"dssup.cli.{_name}":
            raise
