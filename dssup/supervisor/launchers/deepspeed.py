"""The ``deepspeed`` launcher on one node (``deepspeed --num_gpus N train.py ...``).

Parsed as DeepSpeed 0.19 parses it (``deepspeed/launcher/runner.py``; argparse with
abbreviations on, so ambiguous worker prefixes are refused as for torchrun); a test compares
the option table with the runner's own parser. The world size follows the runner: ``--num_gpus``
(``--num_accelerators``) when given, else the hosts/slots of ``--include``, else
``CUDA_VISIBLE_DEVICES``, else the GPUs seen; with none of these on a CPU machine dssup refuses
and asks for ``--num_gpus``. A hostfile naming other hosts (``-H``, or ``/job/hostfile``) or
``--num_nodes`` above 1 is a multi-node launch over ssh/pdsh, which dssup does not drive: run
``dssup run -- torchrun ...`` on each node instead.

The runner starts ``deepspeed.launcher.launch``, which starts one process per rank (with
``--local_rank=N`` unless ``--no_local_rank``), polls them every second and kills the others
when one fails. It writes no error files; dssup adds ``--enable_each_rank_log <attempt>/logs``
(one combined output file per rank, which dssup copies to the console with a ``[rankN]:``
prefix and watches for failures).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dssup.errors import ConfigError
from dssup.supervisor.launchers.base import (
    FIELD,
    LaunchCommand,
    OptionTable,
    RankLog,
    World,
    gpu_count,
    parse_int,
)

__all__ = ["DEEPSPEED", "DeepSpeedLauncher"]

_VALUES = {
    "hostfile": ["-H", "--hostfile"],
    "include": ["-i", "--include"],
    "exclude": ["-e", "--exclude"],
    "num_nodes": ["--num_nodes"],
    "num_gpus": ["--num_gpus", "--num_accelerators"],
    "master_port": ["--master_port"],
    "master_addr": ["--master_addr"],
    "node_rank": ["--node_rank"],
    "launcher": ["--launcher"],
    "launcher_args": ["--launcher_args"],
    "enable_each_rank_log": ["--enable_each_rank_log"],
    "autotuning": ["--autotuning"],
    "bind_core_list": ["--bind_core_list"],
    "ssh_port": ["--ssh_port"],
    "venv_script": ["--venv_script"],
    "log_level": ["--log_level"],
}
_FLAGS = {
    "help": ["-h", "--help"],
    "module": ["--module"],
    "no_python": ["--no_python"],
    "no_local_rank": ["--no_local_rank"],
    "no_ssh": ["--no_ssh"],
    "no_ssh_check": ["--no_ssh_check"],
    "force_multi": ["--force_multi"],
    "save_pid": ["--save_pid"],
    "bind_cores_to_rank": ["--bind_cores_to_rank"],
    "quiet": ["-q", "--quiet"],
}
TABLE = OptionTable.build("deepspeed", _VALUES, _FLAGS)
_DEFAULT_HOSTFILE = "/job/hostfile"
_RANK_FILE = re.compile(r"_rank(\d+)\.log$")


def _hosts(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [ln.split()[0] for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _include_slots(spec: str) -> int | None:
    """Slots on this node from ``--include localhost:0,1`` (one host only)."""
    hosts = [h for h in spec.split("@") if h]
    if len(hosts) != 1:
        return None
    _, _, slots = hosts[0].partition(":")
    return len(slots.split(",")) if slots else None


class DeepSpeedLauncher:
    name = "deepspeed"
    table = TABLE
    echo_rank_logs = True

    def match(self, argv: list[str]) -> int | None:
        if os.path.basename(argv[0]) in {"deepspeed", "ds"}:
            return 1
        if os.path.basename(argv[0]).startswith("python"):
            for i, tok in enumerate(argv[1:], start=1):
                if tok == "-m" and i + 1 < len(argv) and argv[i + 1] == "deepspeed.launcher.runner":
                    return i + 2
        return None

    def env_option(self, cmd: LaunchCommand, name: str) -> str | None:
        return None  # the runner reads only its flags (and CUDA_VISIBLE_DEVICES, see world)

    def _single_node(self, cmd: LaunchCommand) -> None:
        hostfile = Path(cmd.options.get("hostfile") or _DEFAULT_HOSTFILE)
        hosts = _hosts(hostfile)
        nodes = parse_int(cmd.options.get("num_nodes"), "--num_nodes", "") or 1
        if len(hosts) > 1 or nodes > 1 or "force_multi" in cmd.options:
            raise ConfigError(
                FIELD,
                f"a multi-node deepspeed launch ({len(hosts)} hosts in {hostfile}, "
                f"--num_nodes {nodes}) is started over ssh/pdsh, which dssup does not drive",
                "run `dssup run -- torchrun ...` on each node, or launch one node",
            )

    def world(self, cmd: LaunchCommand) -> World:
        self._single_node(cmd)
        gpus = parse_int(cmd.options.get("num_gpus"), "--num_gpus", "give a whole number")
        if gpus is not None and gpus > 0:
            return World(1, gpus, 0, "--num_gpus")
        if cmd.options.get("include"):
            slots = _include_slots(str(cmd.options["include"]))
            if slots:
                return World(1, slots, 0, "--include")
        visible = cmd.env.get("CUDA_VISIBLE_DEVICES", "")
        if visible:
            return World(1, len([d for d in visible.split(",") if d.strip()]), 0,
                         "CUDA_VISIBLE_DEVICES")  # fmt: skip
        if gpu_count():
            return World(1, gpu_count(), 0, "the GPUs seen (the runner's default)")
        raise ConfigError(
            FIELD,
            "the deepspeed launcher would count accelerators itself and dssup sees no GPU",
            "pass --num_gpus N",
        )

    def extras(self, cmd: LaunchCommand, attempt_dir: Path) -> list[str]:
        if cmd.has("enable_each_rank_log"):
            return []
        return ["--enable_each_rank_log", str(attempt_dir / "logs")]

    def log_dir(self, cmd: LaunchCommand, attempt_dir: Path) -> Path | None:
        user = cmd.option("enable_each_rank_log")
        return Path(user) if user else attempt_dir / "logs"

    def rank_logs(self, log_dir: Path) -> dict[int, RankLog]:
        """``<log_dir>/<YYYYmmddHHMMSS>_rank<N>.log`` of the newest launch (one node: local
        rank = rank)."""
        files = sorted(log_dir.glob("*_rank*.log"))
        if not files:
            return {}
        newest = files[-1].name.split("_rank")[0]
        out = {}
        for f in files:
            m = _RANK_FILE.search(f.name)
            if m and f.name.startswith(newest + "_rank"):
                rank = int(m.group(1))
                out[rank] = RankLog(rank, rank, f, None)
        return out


DEEPSPEED = DeepSpeedLauncher()
