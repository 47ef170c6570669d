"""``dssup models``: what ``--model`` accepts by name, and the architectures read exactly.

A user should not have to guess whether dssup knows ``meta-llama/Llama-3.1-70B-Instruct``: this
lists every Hub id the registry ships with its parameter count and where its config came from,
the presets, and the ``model_type`` values read exactly (anything else needs
``--approximate-as``).
"""

from __future__ import annotations

import json
from typing import Any

import click

from dssup import modelzoo
from dssup.cli.app import main
from dssup.memory import known_model_types, preset, preset_names
from dssup.memory.params import model_total
from dssup.memory.presets import PRESETS
from dssup.modelio import load_model

__all__ = ["models_cmd"]


def _rows() -> list[dict[str, Any]]:
    rows = []
    for e in modelzoo.entries():
        spec = load_model(e.id)
        cfg = modelzoo.load_config(e) if e.file else PRESETS[e.preset or ""]
        rows.append(
            {
                "id": e.id,
                "also": list(e.ids[1:]),
                "model_type": cfg.get("model_type"),
                "params": model_total(spec, "megatron"),
                "source": e.source.kind,
                "from": f"{e.source.repo}:{e.source.path}@{e.source.commit[:12]}",
            }
        )
    return rows


@main.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def models_cmd(as_json: bool) -> None:
    """List the models --model accepts by name, and the model types read exactly.

    \b
    Hub ids match case-insensitively; a config.json of any listed model_type is read exactly:
      dssup estimate --model meta-llama/Meta-Llama-3-70B --gpus 64 --tp 8 --pp 2 \\
          --global-batch-size 512 --zero 1
    A config.json of another model_type is refused unless you name an approximation:
      dssup estimate --model tests/fixtures/models/moonshotai--Kimi-K2-Instruct.json \\
          --approximate-as deepseek_v3
    Column source: copy (the published file), resave (a save_pretrained copy), printed (the
    config transformers printed after loading the published file), transcription (a
    third-party transcription of it), preset (a dssup preset checked against a file).
    """
    rows = _rows()
    presets = {p: model_total(preset(p), "megatron") for p in preset_names()}
    if as_json:
        doc = {"models": rows, "presets": presets, "model_types": known_model_types()}
        click.echo(json.dumps(doc, separators=(",", ":")))
        return
    width = max(len(r["id"]) for r in rows)
    click.echo(f"{'Hub id':<{width}}  {'model_type':<15} {'params':>9}  source")
    for r in rows:
        also = f"  (also {', '.join(r['also'])})" if r["also"] else ""
        click.echo(
            f"{r['id']:<{width}}  {r['model_type']!s:<15} {r['params'] / 1e9:8.2f}B  "
            f"{r['source']}{also}"
        )
    click.echo("\npresets: " + ", ".join(f"{p} ({n / 1e9:.2f}B)" for p, n in presets.items()))
    click.echo("model types read exactly: " + ", ".join(known_model_types()))
