"""The root click group, shared options and the error-to-exit-code mapping."""

from __future__ import annotations

import gc
import importlib
import re
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import click
from pydantic import ValidationError

from dssup.cli.values import Bad, Choice
from dssup.errors import ConfigError, DssupError
from dssup.obs.log import configure_logging

__all__ = ["DssupGroup", "main"]


class DssupGroup(click.Group):
    """Turns dssup's own errors into one line on stderr instead of a traceback, and imports a
    sub-command's module when the command is asked for (``lazy``: command name -> the modules
    that define it, in order): ``dssup plan`` never imports the webhook's server or the
    supervisor."""

    lazy: Mapping[str, tuple[str, ...]] = MappingProxyType({})
    freeze_heap = False

    def main(self, args: Sequence[str] | None = None, *rest: Any, **kw: Any) -> Any:
        # ``args`` None: the process's own command line (the console script, ``python -m
        # dssup``), not a test runner calling in: only then is its heap frozen
        self.freeze_heap = args is None
        try:
            return super().main(args, *rest, **{**kw, "standalone_mode": False})
        except click.UsageError as exc:  # the group's own options (``--log-level``)
            click.echo(f"dssup: error: {_usage(exc)}", err=True)
            sys.exit(2)
        except click.exceptions.Exit as exc:  # --help, --version
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("dssup: aborted", err=True)
            sys.exit(130)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        found = super().resolve_command(ctx, args)  # imports the command's modules
        if self.freeze_heap:
            # Everything imported so far lives as long as the process: out of the collector's
            # reach, a collection walks only what the command allocates (a one-shot ``dssup
            # plan`` otherwise paid a full walk of the import-time heap inside its search).
            gc.freeze()
        return found

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module in self.lazy.get(cmd_name, ()):
            importlib.import_module(module)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        for name in self.lazy:
            self.get_command(ctx, name)
        return super().list_commands(ctx)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # click's parsing: its three lines made one
            click.echo(f"dssup: error: {_usage(exc)}", err=True)
            sys.exit(2)
        except ConfigError as exc:
            click.echo(
                f"dssup: error: {_flag(exc.field)}: {exc.problem}"
                + (f"; {exc.fix}" if exc.fix else ""),
                err=True,
            )
            sys.exit(2)
        except ValidationError as exc:
            click.echo(f"dssup: error: {_first_error(exc)}", err=True)
            sys.exit(2)
        except DssupError as exc:
            click.echo(f"dssup: error: {exc}", err=True)
            sys.exit(getattr(exc, "exit_code", 125))


def _flag(field: str) -> str:
    """``tp`` -> ``--tp``: name the flag the user typed; dotted or file fields stay as they are."""
    return "--" + field.replace("_", "-") if re.fullmatch(r"[a-z][a-z_]*", field) else field


def _usage(exc: click.UsageError) -> str:
    """A parsing error (missing or unknown option, bad value) as one line: the flag, click's
    own message, and where the options are listed."""
    path = exc.ctx.command_path if exc.ctx is not None else "dssup"
    help_ = f"see `{path} --help`"
    if isinstance(exc, click.MissingParameter) and exc.param is not None and exc.param.opts:
        flag = max(exc.param.opts, key=len)
        return f"{flag}: missing; add {flag} ({help_})"
    if isinstance(exc, Bad):  # the edge's own check (``values.py``): flag, problem, fix
        return f"{_param_flag(exc.param)}: {exc.problem}; {exc.fix}"
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        return f"{_param_flag(exc.param)}: {' '.join(exc.message.split()).rstrip('.')}; {help_}"
    msg = " ".join(exc.format_message().split()).rstrip(".")
    return f"{msg}; {help_}"


def _param_flag(param: click.Parameter | None) -> str:
    if param is None:
        return "value"
    if not param.opts or isinstance(param, click.Argument):
        return (param.name or "value").upper()
    longs = [o for o in param.opts if o.startswith("--")] or list(param.opts)
    return "/".join(longs)


def _first_error(exc: ValidationError) -> str:
    """One line from pydantic's report: the field as a flag, the problem, the fix (a
    ``ConfigError`` raised by a model's own validator names its field itself)."""
    err = exc.errors(include_url=False)[0]
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, ConfigError):
        return f"{_flag(inner.field)}: {inner.problem}" + (f"; {inner.fix}" if inner.fix else "")
    field = ".".join(str(p) for p in err["loc"]) or exc.title
    msg = str(err["msg"]).removeprefix("Value error, ")
    ctx = err.get("ctx") or {}
    fix = ""
    if "ge" in ctx or "gt" in ctx:
        fix = f"; use a value {'>=' if 'ge' in ctx else '>'} {ctx.get('ge', ctx.get('gt'))}"
    return f"{_flag(field)}: {msg}{fix}"


@click.group(cls=DssupGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-format",
    type=Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines as human text or one JSON object per line.",
)
@click.option(
    "--log-level",
    type=Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Least severe log lines shown.",
)
@click.version_option(package_name="dssup")
def main(log_format: str, log_level: str) -> None:
    """dssup keeps distributed training jobs from dying of GPU out-of-memory.

    \b
    Predict per-GPU memory before you launch:
      dssup estimate --model deepseek-v3 --tp 2 --pp 16 --ep 8 --dp 32 --zero 1 \\
          --recompute full --global-batch-size 1024 --gpu-memory H100
    Find the cheapest config that fits, keeping the global batch exact:
      dssup plan --model deepseek-v3 --gpus 1024 --global-batch-size 1024 --gpu-memory 80GiB
    Run a torchrun job that recovers from OOM:
      dssup run --global-batch-size 32 --micro-batch-size 16 -- \\
          torchrun --standalone --nproc-per-node 2 examples/train_tiny.py
    """
    configure_logging("json" if log_format == "json" else "text", log_level)
