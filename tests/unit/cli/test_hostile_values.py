"""Every option of every command, driven with hostile values: no traceback, ever.

The commands and their options are read from the CLI itself (a new option is covered the day it
is added). Each example takes a cheap valid invocation of one command and puts one to three
options on it with values drawn from a hostile list (zero, negatives, 40-digit and 400-digit
numbers, NaN, infinities, units a GPU cannot have, empty items, NUL bytes, paths that cannot be
written, a FIFO where a file is written) or from hypothesis' own text, integers and floats. The answer must be an exit status
the command documents; a refusal (exit 2) must be exactly one line, ``dssup: error: ...``.

Where a command's valid input leads to real work that cannot run once per example (launching
torchrun, tracing a model in a child process, serving HTTPS), the work itself is replaced by
``Reached``: the example has passed every check the command makes before that point, which is
what this test is about. Those commands run for real in their own tests (integration, e2e).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dssup.cli import main
from tests.repo import repo_state

REPO = Path(__file__).resolve().parents[3]
JOB = str(REPO / "examples" / "k8s" / "pytorchjob-deepseek-v3.yaml")


class Reached(Exception):
    """The command passed its checks and would now start its real work."""


def _reached(*_: Any, **__: Any) -> Any:
    raise Reached


HOSTILE = [
    "", " ", "0", "-0", "-1", "1", "2", "3", "7", "64", "-32", "1e3", "2.5", "0.5", "1.0",
    "nan", "NaN", "inf", "-inf", "1e308", "1e-320", "9" * 30, "9" * 400, "0x10", "1_000",
    "\x00", "\u2603", "80TB", "80", "80GiB", "-80GiB", "0GiB", "1e400GiB", "2TiB", "H100",
    "h100,a100-40gb", "H100,", ",", ",,", "a,b", "1,0", "2,3", "4,4,4,1", "1:0", "4:2", "0:0",
    "-1:4", "1:" + "9" * 25, "none", "full", "selective", "fp8", "json", "text", "%s", "{}",
    "[]", "'", '"', "\\", "\n", "--help", "-", "=", ".", "..", "fifo", "/nonexistent/x",
    "/proc/version", "deepseek-v3", "llama-3-8b", "gpt2", "meta-llama/Meta-Llama-3-8B",
    "examples/custom_block/config.json", "DEBUG", "x" * 300,
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=24),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)

# A cheap valid invocation of each command (its own options come first, drawn ones after).
BASE: dict[str, list[str]] = {
    "estimate": ["--model", "llama-3-8b"],
    "plan": ["--model", "llama-3-8b", "--gpus", "8", "--global-batch-size", "64",
             "--gpu-memory", "H100", "--top", "2"],
    "plan-elastic": ["--model", "llama-3-8b", "--nnodes", "1:2", "--nproc-per-node", "8",
                     "--global-batch-size", "64", "--gpu-memory", "H100"],
    "gpus": [],
    "models": [],
    "status": [],
    "admit": ["-f", JOB],
    "run": [],
    "measure": ["--model", "llama-3-8b", "--layers", "1", "--seq-len", "16"],
    "calibrate": ["--model", "llama-3-8b", "--layers", "1", "--seq-len", "16", "--out", "p.json"],
    "demo": [],
    "webhook serve": [],
}  # fmt: skip
EXAMPLES = {"plan": 30, "plan-elastic": 40}  # a plan search is ~1 s
EXITS: dict[str, set[int]] = {"run": {0, 1, 2, 3, 125, 126, 127}}
AFTER = {"run": ["--", "/nonexistent/dssup-test-command"]}


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(main)
    out: list[tuple[str, click.Command]] = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])
        else:
            out.append((" ".join(path), cmd))

    walk(main, [])
    return out


COMMANDS = dict(_commands())


def test_every_command_has_a_base_invocation() -> None:
    assert set(COMMANDS) == set(BASE), "add the new command to BASE (and its real test)"


def _options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option) and p.name != "help"]


@contextlib.contextmanager
def _no_real_work(mp: pytest.MonkeyPatch) -> Iterator[None]:
    """Torchrun, traced children and the HTTPS server: stopped where they would start (the
    demo's own ``dssup estimate``/``plan`` children answer at once: they run in the docs tests)."""
    import dssup.cli.calibrate
    import dssup.cli.demo
    import dssup.cli.measure
    import dssup.cli.webhook
    from dssup.supervisor import Supervisor
    from dssup.supervisor.multinode import MultiNodeSupervisor

    mp.setattr(Supervisor, "run", _reached)
    mp.setattr(MultiNodeSupervisor, "run", _reached)
    mp.setattr(dssup.cli.measure, "run_child", _reached)
    mp.setattr(dssup.cli.calibrate, "run_child", _reached)
    mp.setattr(dssup.cli.webhook, "WebhookServer", _reached)
    mp.setattr(dssup.cli.demo, "_run_shown", lambda *_: 0)
    yield


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    before = repo_state()
    yield _made(tmp_path_factory)
    assert repo_state() == before, "a hostile value made a command write into the repository"


def _made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("hostile")
    (work / "cert.pem").write_text("not read before the server starts\n")
    (work / "cluster.yaml").write_text("[]\n")
    os.mkfifo(work / "fifo")  # a node that is not a regular file (never /dev/null itself)
    return work


def _argv(command: str, drawn: list[tuple[click.Option, str | None]], work: Path) -> list[str]:
    argv = [*command.split(), *BASE[command]]
    if command == "webhook serve":
        cert = str(work / "cert.pem")
        argv += ["--cert-file", cert, "--key-file", cert, "--cluster-file", str(work / "cluster.yaml")]  # fmt: skip
    for opt, value in drawn:
        flag = max(opt.opts, key=len)
        argv += [flag] if value is None else [flag, value]
    return [*argv, *AFTER.get(command, [])]


def _check(command: str, argv: list[str], work: Path, parse_only: bool = False) -> None:
    mp = pytest.MonkeyPatch()
    cwd = os.getcwd()
    try:
        os.chdir(work)
        if parse_only:
            mp.setattr(COMMANDS[command], "callback", _reached)
        with _no_real_work(mp):
            res = CliRunner().invoke(main, argv, catch_exceptions=True)
    finally:
        os.chdir(cwd)
        mp.undo()
    if isinstance(res.exception, Reached):
        return
    shown = f"dssup {' '.join(map(repr, argv))}\nstdout: {res.stdout[-800:]}\nstderr: {res.stderr}"
    exc = res.exception
    assert exc is None or isinstance(exc, SystemExit), f"{type(exc).__name__}: {exc}\n{shown}"
    assert "Traceback" not in res.stdout + res.stderr, shown
    assert res.exit_code in EXITS.get(command, {0, 1, 2}), shown
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dssup: error: "), shown


# Values a string option takes in real use, so that valid-but-extreme combinations are reached
# (a draw of only hostile values stops at the first refusal).
PLAUSIBLE_TEXT = {
    "model": ["llama-3-8b", "deepseek-v3", "gpt2", "Qwen/Qwen3-30B-A3B", "mixtral-8x7b"],
    "hf": ["openai-community/gpt2", "examples/custom_block/config.json"],
    "layers_per_stage": ["32", "16,16", "1,31", "4,4,4,4,4,4,4,4"],
    "dtypes": ["moments=bf16", "master=none", "activations=fp8", "weights=fp32,grads=fp32"],
    "recompute_modules": ["core_attn", "mlp,moe", "core_attn,layernorm"],
    "zero_stages": ["0,1", "3", "1,2,3"],
    "nnodes": ["1", "1:2", "2:4", "1:1024"],
    "approximate_as": ["llama", "generic", "deepseek_v3"],
    "trace_micro_batches": ["1,2,3", "2,3,4,5"],
    "trace_seq_lens": ["8,12,16", "4,8,16"],
    "default_gpu": ["NVIDIA-H100-80GB-HBM3", "h100"],
    "gpu_name": ["H100", "A100-40GB"],
}


def _plausible(opt: click.Option) -> st.SearchStrategy[str]:
    """Values a user of this option would type, boundaries included."""
    kind = type(opt.type).__name__
    if kind == "Whole":
        lo, hi = opt.type.lo, opt.type.hi  # type: ignore[attr-defined]
        edges = [lo, lo + 1, hi - 1, hi, min(hi, 2), min(hi, 8), min(hi, 64)]
        return st.sampled_from(edges).map(str)
    if kind == "Real":
        lo, hi = opt.type.lo, opt.type.hi  # type: ignore[attr-defined]
        return st.sampled_from([lo, hi, (lo + hi) / 2, min(hi, lo + 0.5)]).map(repr)
    if kind == "Size":
        return st.sampled_from(["80GiB", "H100", "A100-40GB", "1TiB", "1GiB", "0", "512MiB"])
    choices = [str(c) for c in getattr(opt.type, "choices", [])]
    if choices:
        return st.sampled_from(choices)
    if kind == "Place":  # where a command writes: only ever inside the sandbox
        return st.sampled_from(["out.png", "sub", "new/out.png"])
    if kind == "Existing":
        return st.sampled_from([JOB, "cluster.yaml", "."])
    known = PLAUSIBLE_TEXT.get(opt.name or "", [])
    default = [str(opt.default)] if isinstance(opt.default, str) and opt.default else []
    return st.sampled_from(known + default or ["x"])


@st.composite
def _drawn(draw: Any, command: str) -> list[tuple[click.Option, str | None]]:
    options = _options(COMMANDS[command])
    picked = draw(st.lists(st.sampled_from(options), min_size=1, max_size=3, unique_by=id))
    out: list[tuple[click.Option, str | None]] = []
    for i, opt in enumerate(picked):
        if opt.is_flag:
            out.append((opt, None))
            continue
        # at most one hostile value per example, so the rest of the command is reached
        hostile = i == 0 and draw(st.booleans())
        out.append((opt, draw(VALUES if hostile else _plausible(opt))))
    return out


@pytest.mark.parametrize("command", sorted(BASE))
def test_hostile_values_get_one_line_never_a_traceback(command: str, sandbox: Path) -> None:
    @settings(
        max_examples=EXAMPLES.get(command, 60),
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(drawn=_drawn(command))
    def check(drawn: list[tuple[click.Option, str | None]]) -> None:
        _check(command, _argv(command, drawn, sandbox), sandbox)

    check()


@pytest.mark.parametrize("command", sorted(BASE))
def test_each_option_alone_with_each_hostile_value(command: str, sandbox: Path) -> None:
    """The whole table, not a sample: every option of the command with every hostile value,
    run to the end (for ``plan`` and ``plan-elastic``, whose every accepted cell would cost a
    search, to the end of their checks: the sampled test above runs their searches)."""
    parse_only = command in EXAMPLES
    for opt in _options(COMMANDS[command]):
        values: list[str | None] = [None] if opt.is_flag else list(HOSTILE)
        for value in values:
            _check(command, _argv(command, [(opt, value)], sandbox), sandbox, parse_only)
