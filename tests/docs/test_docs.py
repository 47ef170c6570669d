"""Docs are tests: every command and code block of README.md and docs/*.md and every ``--help``
example runs as written and does what it shows (rules: ``tests/docs/doccheck.py``).

A document's commands run in document order in one sandbox folder (the repository's folders
linked in), so a command may use what an earlier one wrote (``dssup calibrate ... --out v3.json``
then ``--calibration v3.json``). They run in the background from the end of collection
(``tests/docs/runner.py``; these tests run last and check what each command did). A block that
cannot run here is marked with its reason in the document and listed by
``test_what_is_not_run_says_why``. At the end the repository must be as clean as before: no
documented command writes into it.
"""

from __future__ import annotations

import json
import re
import subprocess

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
from tests.docs.runner import Outcome, Runner
from tests.repo import repo_state

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WAIT = 3 * 3600  # s a test waits for its document's commands (each is bounded by TIMEOUT)


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


def _norm(text: str) -> str:
    return " ".join(text.split())


def _check_command(cmd: Command, res: subprocess.CompletedProcess[str], where: str) -> None:
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


@pytest.fixture(scope="session")
def runner(request: pytest.FixtureRequest) -> Runner:
    """The runner ``tests/docs/conftest.py`` started when collection ended."""
    found: Runner | None = getattr(request.config, "dssup_docs_runner", None)
    assert found is not None, "tests/docs/conftest.py starts the runner when collection ends"
    return found


def _ran(runner: Runner, snip: Snippet) -> Outcome:
    out = runner.outcome(snip, WAIT)
    if out.failure:
        ran = "".join(f"$ {c.text}\n" for c, _ in out.results)
        pytest.fail(f"{snip.where}: {out.failure}\n{ran}")
    return out


@pytest.mark.timeout(WAIT + 60)
@pytest.mark.parametrize("snip", SNIPPETS, ids=_id)
def test_doc_snippet(snip: Snippet, runner: Runner) -> None:
    if snip.skip:
        return  # listed, with its reason, by test_what_is_not_run_says_why
    if snip.kind in ("shell", "python"):
        out = _ran(runner, snip)
        assert out.results, f"{snip.where}: a command block without commands"
        for cmd, res in out.results:
            _check_command(cmd, res, snip.where)
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
        ((_, res),) = _ran(runner, snip).results
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


@pytest.mark.timeout(WAIT + 60)
def test_the_repository_is_left_clean(runner: Runner) -> None:
    """Runs after every snippet (conftest orders it last): no documented command wrote into
    the repository."""
    assert runner.finished(WAIT), "the documents' commands did not finish"
    assert repo_state() == runner.before, "a documented command wrote into the repository"
