"""Understand and rewrite a ``torchrun`` command line without importing torch.

dssup wraps the user's own command (``torchrun ... train.py ...`` or
``python -m torch.distributed.run ...``). It needs three things from it: the world size
(``--nnodes`` x ``--nproc-per-node``, or torchrun's ``PET_*`` environment that Kubeflow sets),
the split between launcher options and worker arguments, and a way to add its own launcher
options (``--log-dir``, ``--max-restarts 0``, ``--redirects 3 --tee 3``) unless the user set
them. torchrun's option table is copied here (torch 2.13); a test compares it with torch's own
parser. Worker arguments that torchrun would read as an ambiguous prefix of its options make it
abort with exit 2; dssup refuses them up front instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from dssup.errors import ConfigError

__all__ = ["TORCHRUN_FLAGS", "TORCHRUN_OPTIONS", "TorchrunCommand", "parse_command"]

# Options that take a value; each spelling torchrun accepts (dash and underscore forms).
_VALUE_OPTS = (
    "nnodes",
    "nproc-per-node",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "rdzv-conf",
    "max-restarts",
    "monitor-interval",
    "start-method",
    "event-log-handler",
    "role",
    "log-dir",
    "local-ranks-filter",
    "duplicate-stdout-filters",
    "duplicate-stderr-filters",
    "node-rank",
    "master-addr",
    "master-port",
    "local-addr",
    "logs-specs",
    "numa-binding",
    "signals-to-handle",
    "shutdown-timeout",
)
_FLAG_OPTS = ("standalone", "module", "no-python", "run-path", "virtual-local-rank", "help")
_SINGLE = {"nnodes", "standalone", "role", "module", "help", "redirects", "tee"}


def _spellings(name: str) -> set[str]:
    out = {f"--{name}"}
    if name not in _SINGLE:
        out.add("--" + name.replace("-", "_"))
    return out


TORCHRUN_OPTIONS: frozenset[str] = frozenset(
    s for n in (*_VALUE_OPTS, "redirects", "tee") for s in _spellings(n)
) | {"-r", "-t"}
TORCHRUN_FLAGS: frozenset[str] = frozenset(s for n in _FLAG_OPTS for s in _spellings(n)) | {
    "-m",
    "-h",
}
_CANON = {s: n for n in (*_VALUE_OPTS, *_FLAG_OPTS) for s in _spellings(n)}
_CANON.update({"-r": "redirects", "--redirects": "redirects", "-t": "tee", "--tee": "tee"})
_CANON.update({"-m": "module", "-h": "help"})
_LAUNCHERS = ("torchrun",)
_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass
class TorchrunCommand:
    """A parsed launcher command. ``options`` maps canonical torchrun option names to values."""

    prefix: list[str]  # ["torchrun"] or ["python", "-m", "torch.distributed.run"]
    launcher_args: list[str]
    script: str
    script_args: list[str]
    options: dict[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def option(self, name: str) -> str | None:
        """An option's value from the command, else from ``PET_<NAME>`` (torchrun's rule)."""
        if name in self.options:
            return self.options[name]
        return self.env.get("PET_" + name.upper().replace("-", "_"))

    def has(self, name: str) -> bool:
        return self.option(name) is not None or name in self.options

    def nnodes(self) -> int:
        raw = self.option("nnodes") or "1"
        return int(raw.split(":")[-1])

    def nproc_per_node(self) -> int:
        raw = self.option("nproc-per-node") or "1"
        if raw.isdigit():
            return int(raw)
        if raw in {"gpu", "auto"} and _gpu_count() > 0:
            return _gpu_count()
        return os.cpu_count() or 1

    def world_size(self) -> int:
        return self.nnodes() * self.nproc_per_node()

    def argv(self, extra_launcher: list[str], script_args: list[str] | None = None) -> list[str]:
        """The command to run: the user's launcher options, then dssup's, then the script."""
        args = self.script_args if script_args is None else script_args
        return [*self.prefix, *self.launcher_args, *extra_launcher, self.script, *args]


def _gpu_count() -> int:
    try:
        return len([d for d in os.listdir("/dev") if d[6:].isdigit() and d.startswith("nvidia")])
    except OSError:
        return 0


def _split_prefix(argv: list[str]) -> tuple[list[str], list[str]]:
    if not argv:
        raise ConfigError("command", "no command given", "add: -- torchrun ... train.py")
    if os.path.basename(argv[0]) in _LAUNCHERS:
        return argv[:1], argv[1:]
    if os.path.basename(argv[0]).startswith("python"):
        for i, tok in enumerate(argv[1:], start=1):
            if tok == "-m" and i + 1 < len(argv) and argv[i + 1] in _MODULES:
                return argv[: i + 2], argv[i + 2 :]
    raise ConfigError(
        "command",
        f"{argv[0]!r} is not torchrun",
        "wrap a torchrun command: -- torchrun [options] train.py [args], "
        "or -- python -m torch.distributed.run ...",
    )


def _option_name(token: str) -> tuple[str | None, str | None]:
    """(canonical name, inline value) for a launcher token, or (None, None)."""
    name, sep, value = token.partition("=")
    canon = _CANON.get(name)
    return canon, (value if sep else None)


def ambiguous_prefixes(args: list[str]) -> list[tuple[str, list[str]]]:
    """Worker arguments torchrun's argparse would reject as ambiguous abbreviations."""
    every = sorted(TORCHRUN_OPTIONS | TORCHRUN_FLAGS)
    bad = []
    for tok in args:
        if not tok.startswith("--") or tok == "--":
            continue
        name = tok.split("=", 1)[0]
        if name in every:
            continue
        hits = [o for o in every if o.startswith(name)]
        if len(hits) > 1:
            bad.append((tok, hits))
    return bad


def parse_command(argv: list[str], env: Mapping[str, str] | None = None) -> TorchrunCommand:
    """Split a torchrun command into launcher options and the worker script with its args."""
    prefix, rest = _split_prefix(list(argv))
    options: dict[str, str | None] = {}
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("-") or tok == "-":
            break
        canon, inline = _option_name(tok)
        if canon is None:
            raise ConfigError(
                "command", f"unknown torchrun option {tok!r}", "check the spelling (torch 2.13)"
            )
        if canon in _FLAG_OPTS or inline is not None:
            options[canon] = inline
            i += 1
        else:
            if i + 1 >= len(rest):
                raise ConfigError("command", f"torchrun option {tok} needs a value", "")
            options[canon] = rest[i + 1]
            i += 2
    if i >= len(rest):
        raise ConfigError("command", "no training script in the command", "add train.py")
    script, script_args = rest[i], rest[i + 1 :]
    if bad := ambiguous_prefixes(script_args):
        tok, hits = bad[0]
        raise ConfigError(
            "command",
            f"worker argument {tok!r} is an ambiguous prefix of torchrun options "
            f"({', '.join(hits[:4])}); torchrun would abort with exit 2",
            "spell the worker option out in full",
        )
    return TorchrunCommand(prefix, rest[:i], script, script_args, options, dict(env or os.environ))
