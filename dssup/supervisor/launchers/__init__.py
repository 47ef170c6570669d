"""The launchers ``dssup run`` wraps, one module each behind the ``Launcher`` protocol.

``torchrun`` (and ``python -m torch.distributed.run``), ``accelerate launch`` (and its module
form) and the ``deepspeed`` launcher on one node. Adding one is a new module with a
``Launcher`` object, its option table and a test against the launcher's own parser, plus a
line in ``dssup.supervisor.command.LAUNCHERS``.
"""

from dssup.supervisor.launchers.accelerate import ACCELERATE
from dssup.supervisor.launchers.base import LaunchCommand, Launcher, OptionTable, RankLog, World
from dssup.supervisor.launchers.deepspeed import DEEPSPEED
from dssup.supervisor.launchers.torchrun import TORCHRUN

__all__ = [
    "ACCELERATE",
    "DEEPSPEED",
    "TORCHRUN",
    "LaunchCommand",
    "Launcher",
    "OptionTable",
    "RankLog",
    "World",
]
