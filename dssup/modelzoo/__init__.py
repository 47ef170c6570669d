"""The model registry: real ``config.json`` files of open model families, found by Hub id.

Jobs name their model by a Hub id (``--model_name_or_path meta-llama/Meta-Llama-3-70B``), not
by a file on the machine that judges them; so dssup ships the published configs as package
data (``configs/``, sources in ``catalog.json``: repository, path, commit, and whether the file
is a copy, a ``save_pretrained`` re-save, transformers' printout of the loaded config, or a
third-party transcription) and answers a Hub id with the file, case-insensitively. The memory
model stays free of I/O: this package reads the files and hands dicts to
``dssup.memory.model_from_hf_config``. Presets stay where they are
(``dssup.memory.presets``); an id may point at one when the preset is checked against a file.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Entry", "Source", "entries", "find", "load_config", "normalise"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Source(BaseModel):
    """Where a shipped config comes from."""

    model_config = _FROZEN
    kind: Literal["copy", "resave", "printed", "transcription", "preset"] = Field(
        description="copy: the published file; resave: a save_pretrained copy; printed: the "
        "config as transformers printed it after loading the published file (the serialization "
        "save_pretrained writes), found in a log or document; transcription: a third-party "
        "transcription into code; preset: a dssup preset checked against this file"
    )
    repo: str = Field(description="GitHub owner/name that holds the file")
    path: str = Field(description="path of the file in that repository")
    commit: str = Field(description="commit of the repository the file was taken from")


class Entry(BaseModel):
    """One model of the registry: its Hub ids and its config (a file, or a preset)."""

    model_config = _FROZEN
    ids: tuple[str, ...] = Field(description="Hugging Face Hub ids, first is the canonical one")
    file: str | None = Field(None, description="file under dssup/modelzoo/configs/")
    preset: str | None = Field(None, description="dssup preset name, when no file is shipped")
    source: Source = Field(description="provenance of the config")
    sha256: str | None = Field(None, description="SHA-256 of the shipped file")
    note: str = Field("", description="what to know about this entry")

    @property
    def id(self) -> str:
        return self.ids[0]


def normalise(name: str) -> str:
    """How a model name is matched: case-insensitive, without ``hf://``, ``/`` at the end."""
    return name.strip().lower().removeprefix("hf://").rstrip("/")


@lru_cache(maxsize=1)
def entries() -> tuple[Entry, ...]:
    """Every registered model, sorted by canonical id."""
    doc = json.loads(resources.files(__name__).joinpath("catalog.json").read_text("utf-8"))
    return tuple(Entry.model_validate(e) for e in doc["models"])


@lru_cache(maxsize=1)
def _index() -> dict[str, Entry]:
    return {normalise(i): e for e in entries() for i in e.ids}


def find(name: str) -> Entry | None:
    """The entry registered under Hub id ``name`` (any case), or None."""
    return _index().get(normalise(name))


@lru_cache(maxsize=64)
def _read(file: str) -> str:
    return resources.files(__name__).joinpath("configs", file).read_text("utf-8")


def load_config(entry: Entry) -> dict[str, Any]:
    """The ``config.json`` of a file-backed entry, as a fresh dict."""
    if entry.file is None:
        raise ValueError(f"{entry.id} is backed by preset {entry.preset}, not a file")
    data: dict[str, Any] = json.loads(_read(entry.file))
    return data
