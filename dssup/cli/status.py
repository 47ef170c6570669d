"""``dssup status RUN_DIR``: the story of a supervised run, in plain words, from its journal."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dssup.cli.app import main
from dssup.errors import ConfigError
from dssup.supervisor import Journal
from dssup.supervisor.story import global_batch_text, story, summarize

__all__ = ["status_cmd"]


@main.command("status")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="The summary as one JSON object.")
def status_cmd(run_dir: Path, as_json: bool) -> None:
    """Tell what happened in a run: attempts, failures, decisions, outcome."""
    journal = Journal(run_dir)
    if not journal.started:
        raise ConfigError(str(run_dir), "has no journal.jsonl", "pass a dssup run directory")
    if as_json:
        s = summarize(journal)
        doc = {
            **vars(s),
            "global_batch_status": s.global_batch_status,
            "global_batch_text": global_batch_text(s),
        }
        click.echo(json.dumps(doc, default=str))
        return
    for line in story(journal):
        click.echo(line)
