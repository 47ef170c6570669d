"""Load a model description from where users keep it: a config.json, a folder, a Hub id, a preset.

This is the one place that reads model files, so the memory model itself stays free of I/O.
The order is: an existing path (file or folder), a Hub id the registry ships
(``dssup.modelzoo``), a Hub id in the local Hugging Face cache (nothing is downloaded), a
preset name; ``--model`` (estimate, plan, run) and ``--hf`` (calibrate, measure) take the same
sources. Every failure is one line naming the flag, what was found and what to pass instead: a
binary file, JSON that is not a model config, DeepSeek's own inference config, an unknown
``model_type``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dssup import modelzoo
from dssup.errors import ConfigError
from dssup.memory import ModelSpec, model_from_hf_config, preset, preset_names

__all__ = ["hub_cache_config", "load_model", "model_names", "read_config", "registered_model"]

FLAG = "--model"
_MAX_BYTES = 16 << 20  # a config.json is kilobytes; weights are gigabytes
_FIX = "pass the model's Hugging Face config.json (or its folder), a Hub id from `dssup models`, or a preset"
_SIZE_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "text_config")


def model_names() -> list[str]:
    """Everything ``--model`` accepts by name: Hub ids of the registry and presets."""
    return sorted(
        {i for e in modelzoo.entries() for i in e.ids} | set(preset_names()), key=str.lower
    )


def _read_json(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > _MAX_BYTES:
            raise ConfigError(FLAG, f"{path} is {size:,} bytes, not a config.json", _FIX)
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            FLAG, f"{path} cannot be read ({exc.strerror})", "check the path"
        ) from exc
    if b"\x00" in raw[:8192]:
        raise ConfigError(FLAG, f"{path} is a binary file, not a JSON config", _FIX)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(FLAG, f"{path} is not UTF-8 text, not a JSON config", _FIX) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            FLAG, f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})", _FIX
        ) from None


def _flagged(exc: ConfigError, label: str) -> ConfigError:
    """A config's error restated as one ``--model`` line naming the config and its field."""
    return type(exc)(FLAG, f"{label}: {exc.field}: {exc.problem}", exc.fix)


def _from_config(cfg: Any, label: str, name: str, approximate_as: str | None) -> ModelSpec:
    if not isinstance(cfg, Mapping):
        raise ConfigError(FLAG, f"{label} holds a JSON {type(cfg).__name__}, not a config", _FIX)
    if not any(k in cfg for k in _SIZE_KEYS) and "model_type" not in cfg:
        keys = ", ".join(sorted(cfg)[:5]) or "nothing"
        raise ConfigError(FLAG, f"{label} is not a model config.json (it has {keys})", _FIX)
    try:
        return model_from_hf_config(cfg, name=name, approximate_as=approximate_as)
    except ConfigError as exc:
        if exc.field == "approximate_as":
            raise
        raise _flagged(exc, label) from None


# What an estimate from a registry file that is not the published file itself says about it.
_KIND_NOTES = {
    "transcription": "config from a third-party transcription ({repo}), not a verbatim copy of "
    "the published file",
    "printed": "config as transformers printed it after loading the published file ({repo}; "
    "the serialization save_pretrained writes), not the file itself",
}


def registered_model(entry: modelzoo.Entry, approximate_as: str | None = None) -> ModelSpec:
    """The ``ModelSpec`` of a registry entry (``dssup.modelzoo``), named by its Hub id: its
    preset, or its shipped ``config.json`` read exactly. A preset, a transcription or a printed
    config says so in the notes. The one reading of a registered model, for ``--model`` and
    the webhook alike; errors are ``model_from_hf_config``'s (``UnknownModelType`` for a
    ``model_type`` dssup does not read)."""
    if entry.preset is not None:
        spec = preset(entry.preset)
        note = f"{entry.id}: the {entry.preset} preset ({entry.note})"
        return spec.model_copy(update={"name": entry.id, "notes": (*spec.notes, note)})
    spec = model_from_hf_config(
        modelzoo.load_config(entry), name=entry.id, approximate_as=approximate_as
    )
    kind = _KIND_NOTES.get(entry.source.kind)
    if kind is None:
        return spec
    note = f"{entry.id}: " + kind.format(repo=entry.source.repo)
    return spec.model_copy(update={"notes": (*spec.notes, note)})


def _not_found(text: str) -> ConfigError:
    close = difflib.get_close_matches(text.lower(), [n.lower() for n in model_names()], n=3)
    names = {n.lower(): n for n in model_names()}
    hint = f"did you mean {', '.join(names[c] for c in close)}? " if close else ""
    return ConfigError(
        FLAG,
        f"{text[:200]!r} is neither a file nor a model dssup knows",
        f"{hint}pass a config.json path, a Hub id from `dssup models` (e.g. "
        f"meta-llama/Meta-Llama-3-70B) or a preset ({', '.join(preset_names())})",
    )


def _local(text: str) -> Path | None:
    """The config.json at ``text`` (a file, or a folder holding one), or None when ``text``
    names nothing on this machine. A name the filesystem cannot even look up (too long, a NUL
    byte) names nothing."""
    try:
        path = Path(text).expanduser()
        folder, found, other = path.is_dir(), path.is_file(), path.exists()
        inner = (path / "config.json").is_file() if folder else False
    except (OSError, ValueError):  # ConfigError is a ValueError too: none is raised in here
        return None
    if folder:
        if not inner:
            raise ConfigError(FLAG, f"{path} has no config.json", _FIX)
        return path / "config.json"
    if found:
        return path
    if other:  # a device, FIFO or socket: nothing a config is read from
        raise ConfigError(FLAG, f"{text} is not a regular file", _FIX)
    return None


def hub_cache_config(repo_id: str) -> Path | None:
    """The ``config.json`` of ``repo_id`` in the local Hugging Face cache (what
    ``huggingface_hub`` downloaded earlier: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``; the snapshot ``refs/main`` names, else the newest), or None.
    Nothing is downloaded."""
    parts = repo_id.strip().removeprefix("hf://").strip("/").split("/")
    if len(parts) != 2 or not all(
        re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", p) for p in parts
    ):
        return None
    home = os.environ.get("HF_HOME") or os.path.join(Path.home(), ".cache", "huggingface")
    base = Path(os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub"))
    repo = base / f"models--{parts[0]}--{parts[1]}"
    try:
        ref = repo / "refs" / "main"
        if ref.is_file():
            found = repo / "snapshots" / ref.read_text().strip() / "config.json"
            if found.is_file():
                return found
        snaps = sorted(repo.glob("snapshots/*/config.json"), key=lambda f: f.stat().st_mtime)
    except OSError:
        return None
    return snaps[-1] if snaps else None


def read_config(source: str | Path, flag: str = "--hf") -> tuple[dict[str, Any], Path | str]:
    """The contents of a config.json and where it was read: a file or a folder holding one, a
    Hub id whose published config dssup ships (the same ids ``--model`` takes, ``dssup
    models``), or a Hub id in the local Hugging Face cache. Errors name ``flag``."""
    text = str(source).strip()
    try:
        path = _local(text)
        entry = None if path is not None else modelzoo.find(text)
        if entry is not None:
            if entry.file is None:
                raise ConfigError(
                    flag,
                    f"{entry.id} is known to dssup as the {entry.preset} preset, not as a "
                    "published config file",
                    "pass the model's config.json (or its folder)",
                )
            return modelzoo.load_config(entry), f"{entry.id} (shipped config, {entry.source.repo})"
        path = path or hub_cache_config(text)
        if path is None:
            raise ConfigError(
                flag,
                f"{text!r} is not a config.json, a folder holding one, or a Hub id dssup ships "
                "or finds in the local Hugging Face cache",
                "check the path, or see `dssup models` for the Hub ids",
            )
        doc = _read_json(path)
    except ConfigError as exc:
        raise ConfigError(flag, exc.problem, exc.fix) from None
    if not isinstance(doc, dict):
        raise ConfigError(flag, f"{path} is not a JSON object", "pass a Hugging Face config.json")
    return doc, path


def load_model(
    source: str | Path | Mapping[str, Any], approximate_as: str | None = None
) -> ModelSpec:
    """A ``ModelSpec`` from a config.json path, a folder holding one, a registered Hub id, a
    preset name, or a dict; ``approximate_as`` reads an unknown ``model_type`` as a named family."""
    if isinstance(source, Mapping):
        return _from_config(source, "config", "custom", approximate_as)
    text = str(source).strip()
    path = _local(text)
    if path is not None:
        label = str(path)
        return _from_config(_read_json(path), label, path.parent.name or path.stem, approximate_as)
    entry = modelzoo.find(text)
    if entry is not None:
        try:
            return registered_model(entry, approximate_as)
        except ConfigError as exc:
            if exc.field == "approximate_as":
                raise
            raise _flagged(exc, entry.id) from None
    cached = hub_cache_config(text)
    if cached is not None:
        label = f"{text} (local Hugging Face cache: {cached})"
        return _from_config(_read_json(cached), label, text, approximate_as)
    if text.endswith(".json") or text.startswith(("/", "./", "../", "~")):
        raise ConfigError(FLAG, f"{text[:200]} does not exist", _FIX)
    if text.lower() in preset_names():
        if approximate_as is not None:
            raise ConfigError("approximate_as", "presets are read exactly", "drop --approximate-as")
        return preset(text)
    raise _not_found(text)
