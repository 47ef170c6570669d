"""The ``dssup`` command: the only module that knows every layer and owns exit codes.

Each sub-command lives in its own module of this package and registers itself on ``main``;
``main`` itself only sets up logging and maps ``DssupError`` to one-line messages (exit 2 for
bad input), so no command ever shows a traceback for a user mistake.
"""

from __future__ import annotations

from dssup.cli.app import main

__all__ = ["main"]

# Sub-command modules, imported when their command is asked for (``DssupGroup.lazy``); each
# adds itself to ``main`` on import. ``run`` is defined by ``run`` and given its multi-node
# options by ``elastic``.
main.lazy = {
    "estimate": ("dssup.cli.estimate",),
    "models": ("dssup.cli.models",),
    "plan": ("dssup.cli.plan",),
    "demo": ("dssup.cli.demo",),
    "run": ("dssup.cli.run", "dssup.cli.elastic"),
    "status": ("dssup.cli.status",),
    "webhook": ("dssup.cli.webhook",),
    "admit": ("dssup.cli.admit",),
    "measure": ("dssup.cli.measure",),
    "calibrate": ("dssup.cli.calibrate",),
    "plan-elastic": ("dssup.cli.elastic",),
    "gpus": ("dssup.cli.gpus",),
}
