"""The torchrun command of one generation, and what torchrun says about the group it formed.

Every generation gets a fresh rendezvous: ``--rdzv-id <run>-g<generation>`` (so an agent left
over from an older generation can never join a newer one) and ``--nnodes N`` fixed to the nodes
the decision names (the group forms as soon as they are all there; no last-call window in which
a partial group could start). ``LOGLEVEL=INFO`` on torchrun (unless the user set it) makes it log
``group_rank``/``group_world_size`` after the rendezvous, which the split-brain check reads.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from dssup.errors import ConfigError
from dssup.supervisor.command import LaunchCommand

__all__ = ["DYNAMIC_BACKENDS", "check_elastic_command", "generation_command", "read_group"]

DYNAMIC_BACKENDS = frozenset({"c10d", "etcd", "etcd-v2"})
_REPLACED = {"--nnodes", "--rdzv-id", "--rdzv_id"}
_GROUP_RANK = re.compile(r"\bgroup_rank=(\d+)")
_GROUP_WORLD = re.compile(r"\bgroup_world_size=(\d+)")


def check_elastic_command(cmd: LaunchCommand) -> None:
    """Multi-node dssup needs torchrun with a dynamic rendezvous: a static one pins node ranks
    to the original world, so a smaller or larger generation could not form."""
    if cmd.name != "torchrun":
        raise ConfigError(
            "command",
            f"multi-node dssup (--shared-dir) drives torchrun generations, not {cmd.name}",
            "wrap torchrun with --rdzv-backend c10d (or etcd-v2) on each node",
        )
    backend = cmd.option("rdzv-backend") or "static"
    if backend not in DYNAMIC_BACKENDS:
        raise ConfigError(
            "command",
            f"rendezvous backend {backend!r} cannot change membership",
            "use --rdzv-backend c10d (or etcd-v2) with --rdzv-endpoint HOST:PORT",
        )
    if not cmd.option("rdzv-endpoint"):
        raise ConfigError("command", "no --rdzv-endpoint", "pass --rdzv-endpoint HOST:PORT")


def _strip(args: list[str]) -> list[str]:
    out, skip = [], False
    for tok in args:
        if skip:
            skip = False
            continue
        name, sep, _ = tok.partition("=")
        if name in _REPLACED:
            skip = not sep
            continue
        out.append(tok)
    return out


def generation_command(cmd: LaunchCommand, nnodes: int, rdzv_id: str) -> LaunchCommand:
    """``cmd`` with ``--nnodes`` and ``--rdzv-id`` set for one generation (flags beat the
    ``PET_*`` variables Kubeflow sets, so those are overridden too)."""
    launcher = [*_strip(cmd.launcher_args), "--nnodes", str(nnodes), "--rdzv-id", rdzv_id]
    options = {**cmd.options, "nnodes": str(nnodes), "rdzv-id": rdzv_id}
    return dataclasses.replace(cmd, launcher_args=launcher, options=options)


def read_group(torchrun_log: Path) -> tuple[int | None, int | None]:
    """(group_rank, group_world_size) of the last rendezvous in torchrun's log, if logged."""
    try:
        text = torchrun_log.read_text(errors="replace")
    except OSError:
        return None, None
    ranks, worlds = _GROUP_RANK.findall(text), _GROUP_WORLD.findall(text)
    return (
        int(ranks[-1]) if ranks else None,
        int(worlds[-1]) if worlds else None,
    )
