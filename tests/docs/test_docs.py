"""Docs are tests: every command and code block of README.md and docs/*.md and every ``--help``
example runs as written and does what it shows (rules: ``tests/docs/doccheck.py``).

A document's commands run in document order in one sandbox folder (the repository's folders
linked in), so a command may use what an earlier one wrote (``dssup calibrate ... --out v3.json``
then ``--calibration v3.json``). A block that cannot run here is marked with its reason in the
document and listed by ``test_what_is_not_run_says_why``. At the end the repository must be
as clean as before: no documented command writes into it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from dssup.cli import main
from tests.docs.doccheck import (
    REPO,
    Command,
    Snippet,
    help_snippets,
    inline_snippets,
    markdown_snippets,
)
from tests.procs import reap, reap_tokens
from tests.repo import repo_state

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINKED = ("examples", "k8s", "docs", "dssup", "tests", "bench", "scripts", "gpu")
TIMEOUT = 900  # s per command: the slowest documented one (a full DeepSeek-V3 trace) is ~60 s


def _helps() -> dict[str, str]:
    ctx = click.Context(main)
    out: dict[str, str] = {}

    def walk(cmd: click.Command, path: list[str]) -> None:
        res = CliRunner().invoke(main, [*path, "--help"], terminal_width=100)
        out[" ".join(["dssup", *path])] = res.stdout
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])

    walk(main, [])
    return out


HELPS = _helps()
SNIPPETS: list[Snippet] = [
    *(s for doc in DOCS for s in markdown_snippets(doc)),
    *(s for doc in DOCS for s in inline_snippets(doc)),
    *help_snippets(HELPS, set(main.list_commands(click.Context(main)))),
]


def _id(s: Snippet) -> str:
    return s.where


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    made: dict[str, Path] = {}
    before = repo_state()
    yield made
    for box in made.values():  # nothing a documented command started may outlive the tests
        reap_tokens([j.parent for j in box.rglob("journal.jsonl")])
    assert repo_state() == before, "a documented command wrote into the repository"


def _sandbox(made: dict[str, Path], doc: str, tmp: Path) -> Path:
    if doc not in made:
        box = tmp / re.sub(r"[^A-Za-z0-9]+", "-", doc)
        box.mkdir(parents=True, exist_ok=True)
        for name in LINKED:
            (box / name).symlink_to(REPO / name)
        made[doc] = box
    return made[doc]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(HF_HUB_OFFLINE="1", MPLBACKEND="Agg", PYTHONPATH=str(REPO))
    return env


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        ["bash", "-c", command], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        reap(proc, None)
        reap_tokens([j.parent for j in cwd.rglob("journal.jsonl")])
        out, err = proc.communicate()
        pytest.fail(f"timed out after {TIMEOUT} s: {command}\n{out[-2000:]}\n{err[-2000:]}")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _norm(text: str) -> str:
    return " ".join(text.split())


def _check_command(cmd: Command, cwd: Path, where: str) -> None:
    res = _run(cmd.text, cwd)
    shown = (
        f"{where}: $ {cmd.text}\n--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"
    )
    assert res.returncode == cmd.exit, f"exit {res.returncode}, the doc says {cmd.exit}\n{shown}"
    assert "Traceback (most recent call last)" not in res.stderr, shown
    printed = _norm(res.stdout + "\n" + res.stderr)
    for line in cmd.expect:
        if line.strip() in ("...", "…"):
            continue
        assert _norm(line) in printed, f"the doc shows {line!r}, not printed\n{shown}"


def _flags(span: str) -> tuple[list[str], list[str]]:
    """(command path, flags) of an inline ``dssup ...`` span."""
    words = span.split()
    path: list[str] = []
    group: click.Command = main
    rest = list(words[1:])
    while rest and rest[0] in ("--log-format", "--log-level"):  # dssup's own options
        rest = rest[2:]
    words = [words[0], *rest]
    for w in rest:
        if isinstance(group, click.Group) and w in group.list_commands(click.Context(main)):
            path.append(w)
            sub = group.get_command(click.Context(main), w)
            assert sub is not None
            group = sub
        else:
            break
    own = words[: words.index("--")] if "--" in words else words  # after --: the launched command
    return path, [w.split("=")[0] for w in own if w.startswith("--") and len(w) > 2]


def _known(path: list[str]) -> set[str]:
    text = HELPS.get(" ".join(["dssup", *path]), "")
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", text))


def test_what_is_not_run_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    skipped = [s for s in SNIPPETS if s.skip]
    with capsys.disabled():
        print(f"\n{len(SNIPPETS)} snippets; not run here ({len(skipped)}):")
        for s in skipped:
            print(f"  {s.where}: {s.skip}")
    for s in skipped:
        assert len(s.skip) >= 20, f"{s.where}: say why it cannot run here"
    assert len(skipped) <= 12, "most documented commands must run here"


@pytest.mark.parametrize("snip", SNIPPETS, ids=_id)
def test_doc_snippet(
    snip: Snippet, sandboxes: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    if snip.skip:
        return  # listed, with its reason, by test_what_is_not_run_says_why
    box = _sandbox(sandboxes, snip.doc, tmp_path_factory.getbasetemp() / "docs")
    if snip.kind == "shell":
        assert snip.commands, f"{snip.where}: a command block without commands"
        for cmd in snip.commands:
            _check_command(cmd, box, snip.where)
    elif snip.kind == "python":
        script = box / "snippet.py"
        code = snip.text
        if snip.fragment:  # the reader's own objects: compile, run the imports
            compile(code, snip.where, "exec")
            code = "\n".join(
                line for line in code.splitlines() if re.match(r"\s*(from \S+ )?import ", line)
            )
        script.write_text(code)
        _check_command(Command(f"{sys.executable} snippet.py"), box, snip.where)
    elif snip.kind == "json":
        json.loads(snip.text)
    elif snip.kind == "yaml":
        list(yaml.safe_load_all(snip.text))
    elif snip.kind == "synopsis":
        path, _ = _flags(snip.target)
        known = _known(path)
        shown = set(re.findall(r"(--[a-z][a-z0-9-]*)", snip.text))
        assert shown <= known, f"{snip.where}: {sorted(shown - known)} not in {snip.target} --help"
    elif snip.kind == "keys":
        res = _run(snip.target, box)
        assert res.returncode in (0, 1), res.stderr
        got: set[str] = set()

        def walk(x: object) -> None:
            if isinstance(x, dict):
                got.update(x)
                for v in x.values():
                    walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)

        walk(json.loads(res.stdout))
        shown = set(re.findall(r'"([a-z_0-9]+)"\s*:', snip.text))
        assert shown <= got, f"{snip.where}: {sorted(shown - got)} not in the JSON of {snip.target}"
    elif snip.kind == "flags":
        path, flags = _flags(snip.target)
        assert path or snip.target == "dssup", f"{snip.where}: {snip.target!r} names no command"
        known = _known(path)
        unknown = [f for f in flags if f not in known]
        assert not unknown, f"{snip.where}: {unknown} are not flags of dssup {' '.join(path)}"
