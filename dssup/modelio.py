"""Load a model description from where users keep it: a preset name, a config.json, a folder.

This is the one place that reads model files, so the memory model itself stays free of I/O.
Errors name the path and say what to pass instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dssup.errors import ConfigError
from dssup.memory import ModelSpec, model_from_hf_config, preset, preset_names

__all__ = ["load_model", "read_config"]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            str(path),
            f"not valid JSON ({exc.msg} at line {exc.lineno})",
            "pass a Hugging Face config.json",
        ) from exc
    except OSError as exc:
        raise ConfigError(str(path), f"cannot be read ({exc.strerror})", "check the path") from exc


def read_config(source: str | Path) -> tuple[dict[str, Any], Path]:
    """The contents of a config.json (or of the one in a folder) and the file read."""
    path = Path(str(source)).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(
            str(source), "is not a config.json or a folder holding one", "check the path"
        )
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise ConfigError(str(path), "is not a JSON object", "pass a Hugging Face config.json")
    return doc, path


def load_model(source: str | Path | Mapping[str, Any]) -> ModelSpec:
    """A ``ModelSpec`` from a preset name, a config.json path, a folder holding one, or a dict."""
    if isinstance(source, Mapping):
        return model_from_hf_config(source)
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(
                "model",
                f"{path.parent} has no config.json",
                "pass the model folder that holds config.json, or a preset name",
            )
    if path.is_file():
        return model_from_hf_config(_read_json(path), name=path.parent.name or path.stem)
    if text.endswith(".json") or "/" in text:
        raise ConfigError(
            "model",
            f"{text} does not exist",
            f"pass an existing config.json or one of {', '.join(preset_names())}",
        )
    return preset(text)  # raises UnknownPreset naming the presets
