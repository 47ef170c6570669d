"""The user's own model code on the command line: ``--hf CONFIG`` and ``--module pkg.mod:factory``.

Shared by ``dssup measure`` and ``dssup calibrate``: the options, the request handed to the
child process (``python -m dssup.runtime.traced``, which alone imports torch and transformers),
and the child call itself. A child's bad-input answer comes back as a ``ConfigError`` (one line,
exit 2), any other failure as a ``DssupError`` with the child's last line of stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from dssup.cli.values import Choice, Existing
from dssup.errors import ConfigError, DssupError
from dssup.modelio import read_config

__all__ = ["ProfileRefused", "run_child", "source_options", "traced_knobs", "traced_source"]


class ProfileRefused(DssupError):
    """The traces do not follow the profile's model: no profile is written (exit 1)."""

    exit_code = 1


def run_child(module: str, command: str, request: dict[str, Any]) -> dict[str, Any]:
    """Run ``python -m <module> <command> -`` on ``request``; its JSON answer."""
    proc = subprocess.run(
        [sys.executable, "-m", module, command, "-"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    last: dict[str, Any] = {}
    if lines:
        try:
            last = json.loads(lines[-1])
        except json.JSONDecodeError:
            last = {}
    if proc.returncode == 2 and isinstance(last.get("error"), dict):
        err = last["error"]
        raise ConfigError(str(err["field"]), str(err["problem"]), str(err.get("fix", "")))
    if proc.returncode == 3 and "refused" in last:
        raise ProfileRefused(f"profile refused: {last['refused']}")
    if proc.returncode != 0 or not last:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise DssupError(f"{command} failed (exit {proc.returncode}): {tail[0]}")
    return last


def source_options(fn: Any) -> Any:
    """``--hf``, ``--module``, ``--module-path``, ``--attn``: the user's own model code."""
    options = [
        click.option(
            "--hf",
            "hf",
            default=None,
            help="A transformers config.json (or its folder): the model transformers builds "
            "from it, random init, nothing downloaded.",
        ),
        click.option(
            "--module",
            "module",
            default=None,
            help="Your own model: 'package.module:factory', a function returning "
            "(model, make_batch); see examples/custom_block/model.py.",
        ),
        click.option(
            "--module-path",
            type=Existing("dir"),
            default=None,
            help="Folder to import --module from (default: the current folder).",
        ),
        click.option(
            "--module-config",
            type=Existing("any"),
            default=None,
            help="--module: a config.json stating the model's sizes (for --calibration "
            "predictions; see examples/custom_block/config.json).",
        ),
        click.option(
            "--attn",
            type=Choice(["sdpa", "eager"]),
            default=None,
            help="--hf: transformers attn_implementation (default sdpa).",
        ),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def traced_source(o: dict[str, Any]) -> dict[str, Any] | None:
    """The source of ``--hf`` / ``--module`` (None when neither is given)."""
    given = [k for k in ("model", "hf", "module") if o.get(k)]
    if len(given) > 1:
        raise ConfigError(
            f"--{given[1]}", f"given together with --{given[0]}", "pass exactly one model source"
        )
    if o.get("attn") and not o.get("hf"):
        raise ConfigError("--attn", "applies to --hf only", "drop --attn")
    if o.get("module_config") and not o.get("module"):
        raise ConfigError("--module-config", "applies to --module only", "drop --module-config")
    if o.get("hf"):
        config, path = read_config(o["hf"])
        if o.get("layers") is not None:
            if o["layers"] < 1:
                raise ConfigError("layers", "must be at least 1", "use --layers 1 or more")
            config = {**config, "num_hidden_layers": o["layers"]}
        return {"kind": "hf", "config": config, "path": str(path)}
    if o.get("module"):
        if o.get("layers") is not None:
            raise ConfigError("--layers", "applies to --model and --hf", "size it in your factory")
        folder = o.get("module_path") or Path.cwd()
        return {"kind": "module", "target": o["module"], "sys_path": [str(folder.resolve())]}
    if not o.get("model"):
        raise ConfigError("--model", "no model given", "pass --model, --hf or --module")
    return None


_REFERENCE_ONLY = {
    "dp": 1,
    "zero": 0,
    "offload_optimizer": False,
    "moe_routing": "capacity",
    "capacity_factor": 1.25,
}


def traced_knobs(o: dict[str, Any]) -> dict[str, Any]:
    """The step knobs of ``--hf``/``--module`` from the shared flags."""
    for key, default in _REFERENCE_ONLY.items():
        if key in o and o[key] != default:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(
                flag, "applies to --model (the reference blocks) only", f"drop {flag}"
            )
    if o.get("recompute", "none") == "selective":
        raise ConfigError(
            "--recompute",
            "selective recompute is not something --hf/--module models offer",
            "use none, or full (checkpoint every repeated block: transformers' activation "
            "checkpointing)",
        )
    return {
        "micro_batch": o.get("micro_batch", 1),
        "seq_len": o["seq_len"],
        "dtype": o["dtype"],
        "attention": o.get("attn") or "sdpa",
        "checkpointing": o.get("recompute", "none") == "full",
        "optimizer": o["optimizer"],
        "steps": o.get("steps", 2),
    }
