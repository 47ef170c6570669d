"""Typed access to the fields of a Hugging Face ``config.json``, with errors that name the field.

Each model family reads its own fields (``families.py``); this module only makes every read
strict in one place: a size is a positive whole number, a flag is a JSON boolean, and a value
taken from the model type's default instead of the file is recorded as a note, so it reaches
the estimate's assumptions instead of being a silent guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dssup.errors import ConfigError

__all__ = ["Reader"]

_ABSENT: Any = object()


class Reader:
    """Reads one config object (the top level, or a multimodal ``text_config``)."""

    def __init__(self, cfg: Mapping[str, Any], where: str = "config.json") -> None:
        self.cfg = cfg
        self.where = where
        self.notes: list[str] = []

    def _field(self, key: str) -> str:
        return f"{self.where}:{key}"

    def get(self, key: str) -> Any:
        return self.cfg.get(key)

    def num(self, key: str, *alts: str, default: int | None = None, least: int = 1) -> int:
        """A whole number >= ``least``; the first of ``key, *alts`` that is set, else ``default``
        (a missing field without a default is an error naming it)."""
        for k in (key, *alts):
            value = self.cfg.get(k)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < least:
                    raise ConfigError(
                        self._field(k),
                        f"expected a whole number >= {least}, got {value!r}",
                        f"set {k} to a whole number",
                    )
                return value
        if default is None:
            raise ConfigError(self._field(key), "missing", f"add {key!r} to the config")
        return default

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean (absent or null: ``default``)."""
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(self._field(key), f"expected true or false, got {value!r}", "")
        return value

    def text(self, key: str, default: str) -> str:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(self._field(key), f"expected a string, got {value!r}", "")
        return value

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self.cfg.get(key) or []
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(self._field(key), f"expected a list of layer indices, got {value!r}")
        return tuple(value)

    def tie(self, family: str, default: bool, top: Reader | None = None) -> bool:
        """``tie_word_embeddings`` (of ``top`` for a multimodal wrapper), or the family's default,
        noted: Gemma ties by default, so a missing field is not "untied"."""
        src = top or self
        value = src.cfg.get("tie_word_embeddings", _ABSENT)
        if value is _ABSENT or value is None:
            src.notes.append(
                f"tie_word_embeddings absent: {family} "
                f"{'ties the output head to the embedding' if default else 'keeps a separate output head'}"
                " by default (transformers' config default)"
            )
            return default
        return src.flag("tie_word_embeddings", default)

    def refuse_if(self, key: str, unsupported: object, why: str) -> None:
        """A field value this family's reading does not model: refuse by name, never ignore it."""
        if self.cfg.get(key) == unsupported:
            raise ConfigError(
                self._field(key),
                f"{key}={unsupported!r} is not modelled ({why})",
                "use a config without it or ask for support",
            )
