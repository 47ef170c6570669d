"""``dssup status [RUN_DIR]``: the story of a supervised run, in plain words, from its journal.

With no argument it tells the latest run under ``./dssup-runs`` (where ``dssup run`` puts them);
given a directory of runs it lists them, newest first, one line each.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from dssup.cli.app import main
from dssup.errors import ConfigError
from dssup.supervisor import Journal
from dssup.supervisor.journal import FILENAME
from dssup.supervisor.story import global_batch_text, story, summarize
from dssup.supervisor.text import clip

__all__ = ["status_cmd"]

DEFAULT_RUNS = Path("dssup-runs")


def _runs(parent: Path) -> list[Path]:
    """Run directories under ``parent``, newest journal first."""
    found = [p for p in parent.iterdir() if (p / FILENAME).is_file()] if parent.is_dir() else []
    return sorted(found, key=lambda p: (p / FILENAME).stat().st_mtime, reverse=True)


def _doc(journal: Journal) -> dict[str, object]:
    s = summarize(journal)
    return {
        **vars(s),
        "global_batch_status": s.global_batch_status,
        "global_batch_text": global_batch_text(s),
    }


def _listing(parent: Path, runs: list[Path], as_json: bool) -> None:
    if as_json:
        docs = [{"run_dir": str(r), **_doc(Journal(r))} for r in runs]
        click.echo(json.dumps(docs, default=str))
        return
    click.echo(f"{len(runs)} run(s) under {parent}, newest first:")
    for run in runs:
        journal = Journal(run)
        s = summarize(journal)
        first = journal.first("run-started") or {}
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(first.get("ts", 0)))
        command = clip(" ".join(first.get("command", [])), 70)
        click.echo(f"  {run.name}  {s.outcome:<14} {s.attempts} attempt(s)  {when}  {command}")
    click.echo(f"dssup status {parent}/<run> tells one of them")


@main.command("status")
@click.argument("run_dir", type=click.Path(path_type=Path), required=False)
@click.option("--json", "as_json", is_flag=True, help="The summary as one JSON object.")
def status_cmd(run_dir: Path | None, as_json: bool) -> None:
    """Tell what happened in a run: attempts, failures, decisions, outcome.

    \b
      dssup status                         # the latest run under ./dssup-runs
      dssup status dssup-runs              # list the runs there
      dssup status --json                  # the latest run's numbers
    """
    if run_dir is None:
        runs = _runs(DEFAULT_RUNS)
        if not runs:
            raise ConfigError(
                "RUN_DIR", f"no run found under ./{DEFAULT_RUNS}", "pass a run directory"
            )
        run_dir = runs[0]
    journal = Journal(run_dir)
    if not journal.started:
        runs = _runs(run_dir)
        if runs:
            _listing(run_dir, runs, as_json)
            return
        raise ConfigError(str(run_dir), "has no journal.jsonl", "pass a dssup run directory")
    if as_json:
        click.echo(json.dumps(_doc(journal), default=str))
        return
    for line in story(journal):
        click.echo(line)
