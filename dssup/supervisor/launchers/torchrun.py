"""``torchrun`` and ``python -m torch.distributed.run``: options, world size, per-rank logs.

The option table is torchrun's own (torch 2.13, ``torch/distributed/run.py``); a test compares
it with ``get_args_parser()``. Every value option falls back to ``PET_<NAME>`` in the
environment, as torchrun's ``env`` action does (Kubeflow sets these); a flag on the command
line wins. World size is ``--nnodes`` (the maximum of ``MIN:MAX``) times ``--nproc-per-node``
(``gpu``/``auto``: the GPUs seen, else the CPU count, as torchrun does). For each attempt dssup
adds ``--log-dir <attempt>/logs`` (per-rank ``stderr.log`` and ``error.json``),
``--redirects 3 --tee 3`` (files and console) and ``--max-restarts 0`` unless the user set them.
"""

from __future__ import annotations

import os
from pathlib import Path

from dssup.supervisor.launchers.base import (
    LaunchCommand,
    OptionTable,
    RankLog,
    World,
    gpu_count,
    parse_int,
)

__all__ = ["TORCHRUN", "TORCHRUN_FLAGS", "TORCHRUN_OPTIONS", "Torchrun", "torchrun_rank_logs"]

_VALUE_OPTS = (
    "nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
    "max-restarts", "monitor-interval", "start-method", "event-log-handler", "role", "log-dir",
    "local-ranks-filter", "duplicate-stdout-filters", "duplicate-stderr-filters", "node-rank",
    "master-addr", "master-port", "local-addr", "logs-specs", "numa-binding",
    "signals-to-handle", "shutdown-timeout", "redirects", "tee",
)  # fmt: skip
_FLAG_OPTS = ("standalone", "module", "no-python", "run-path", "virtual-local-rank", "help")
_SINGLE = {"nnodes", "standalone", "role", "module", "help", "redirects", "tee"}
_SHORT = {"redirects": "-r", "tee": "-t", "module": "-m", "help": "-h"}

TABLE = OptionTable.argparse("torchrun", _VALUE_OPTS, _FLAG_OPTS, _SINGLE, _SHORT)
TORCHRUN_OPTIONS: frozenset[str] = frozenset(
    s for s, n in TABLE.canon.items() if n in TABLE.takes_value
)
TORCHRUN_FLAGS: frozenset[str] = TABLE.spellings - TORCHRUN_OPTIONS
_PROGRAMS = ("torchrun",)
_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def torchrun_rank_logs(log_dir: Path) -> dict[int, RankLog]:
    """``<log_dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/`` of the newest torchrun run."""
    runs = sorted(log_dir.glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return {}
    out = {}
    for p in runs[-1].iterdir():
        if p.is_dir() and p.name.isdigit():
            local = int(p.name)
            out[local] = RankLog(local, None, p / "stderr.log", p / "error.json")
    return out


class Torchrun:
    name = "torchrun"
    table = TABLE
    echo_rank_logs = False

    def match(self, argv: list[str]) -> int | None:
        if os.path.basename(argv[0]) in _PROGRAMS:
            return 1
        if os.path.basename(argv[0]).startswith("python"):
            for i, tok in enumerate(argv[1:], start=1):
                if tok == "-m" and i + 1 < len(argv) and argv[i + 1] in _MODULES:
                    return i + 2
        return None

    def env_option(self, cmd: LaunchCommand, name: str) -> str | None:
        return cmd.env.get("PET_" + name.upper().replace("-", "_"))

    def world(self, cmd: LaunchCommand) -> World:
        raw_nodes = cmd.option("nnodes") or "1"
        nnodes = parse_int(raw_nodes.split(":")[-1], "--nnodes", "give N or MIN:MAX") or 1
        raw = cmd.option("nproc-per-node") or "1"
        if raw.isdigit():
            nproc = int(raw)
        elif raw in {"gpu", "auto"} and gpu_count() > 0:
            nproc = gpu_count()
        elif raw in {"cpu", "auto", "gpu"}:
            nproc = os.cpu_count() or 1
        else:
            nproc = parse_int(raw, "--nproc-per-node", "give a number, gpu, cpu or auto") or 1
        node_rank = parse_int(cmd.option("node-rank"), "--node-rank", "give a number")
        where = (
            "--nnodes/--nproc-per-node" if cmd.options.keys() & {"nnodes", "nproc-per-node"} else ""
        )
        source = where or (
            "PET_* variables"
            if any(k.startswith("PET_") for k in cmd.env)
            else "torchrun's defaults"
        )
        return World(
            nnodes,
            nproc,
            node_rank if node_rank is not None else (0 if nnodes == 1 else None),
            source,
        )

    def extras(self, cmd: LaunchCommand, attempt_dir: Path) -> list[str]:
        extra: list[str] = []
        if not cmd.has("log-dir"):
            extra += ["--log-dir", str(attempt_dir / "logs")]
        if not cmd.has("redirects") and not cmd.has("tee"):
            extra += ["--redirects", "3", "--tee", "3"]
        if not cmd.has("max-restarts"):
            extra += ["--max-restarts", "0"]
        return extra

    def log_dir(self, cmd: LaunchCommand, attempt_dir: Path) -> Path | None:
        user = cmd.option("log-dir")
        return Path(user) if user else attempt_dir / "logs"

    def rank_logs(self, log_dir: Path) -> dict[int, RankLog]:
        return torchrun_rank_logs(log_dir)


TORCHRUN = Torchrun()
