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
from dssup.memory.hfdefaults import ALIASES, DEFAULTS, TRANSFORMERS

__all__ = ["Reader"]

_ABSENT: Any = object()


class Reader:
    """Reads one config object (the top level, or a multimodal ``text_config``) as transformers'
    config class ``kind`` does: a field is found under its name or any alias of it (the class's
    ``attribute_map``), and a missing one takes the class's own default, noted
    (``hfdefaults.py``); the family reader's ``default`` comes last (a value computed from other
    fields)."""

    def __init__(
        self, cfg: Mapping[str, Any], where: str = "config.json", kind: str | None = None
    ) -> None:
        self.cfg = cfg
        self.where = where
        self.kind = kind or ""
        self.notes: list[str] = []

    def _field(self, key: str) -> str:
        return f"{self.where}:{key}"

    def _names(self, key: str) -> list[str]:
        """``key`` and what the config class takes as the same field."""
        aliases = ALIASES.get(self.kind, {})
        names = [key]
        if key in aliases:
            names.append(aliases[key])
        names += [alias for alias, attr in aliases.items() if attr == key]
        return names

    def _raw(self, key: str) -> tuple[str, Any]:
        for name in self._names(key):
            value = self.cfg.get(name)
            if value is not None:
                return name, value
        return key, None

    def _class_default(self, key: str) -> Any:
        """The config class's default of a field the file leaves out; None when the file
        states it, even as null (transformers then keeps the null, it does not default)."""
        names = self._names(key)
        if any(n in self.cfg for n in names):
            return None
        table = DEFAULTS.get(self.kind, {})
        return next((table[n] for n in names if n in table), None)

    def get(self, key: str) -> Any:
        return self._raw(key)[1]

    def num(self, key: str, *alts: str, default: int | None = None, least: int = 1) -> int:
        """A whole number >= ``least``; the first of ``key, *alts`` that is set (under any of its
        names), else the config class's default (noted), else ``default`` (a missing field
        without either is an error naming it)."""
        for k in (key, *alts):
            name, value = self._raw(k)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < least:
                    raise ConfigError(
                        self._field(name),
                        f"expected a whole number >= {least}, got {value!r}",
                        f"set {name} to a whole number",
                    )
                return value
        for k in (key, *alts):
            found = self._class_default(k)
            if isinstance(found, int) and not isinstance(found, bool) and found >= least:
                note = (
                    f"{self._field(k)} absent: {found}, the default of transformers "
                    f"{TRANSFORMERS}'s {self.kind} config"
                )
                if note not in self.notes:
                    self.notes.append(note)
                return found
        if default is None:
            raise ConfigError(self._field(key), "missing", f"add {key!r} to the config")
        return default

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean (absent or null: the config class's default, else ``default``)."""
        value = self.get(key)
        if value is None:
            found = self._class_default(key)
            return found if isinstance(found, bool) else default
        if not isinstance(value, bool):
            raise ConfigError(self._field(key), f"expected true or false, got {value!r}", "")
        return value

    def text(self, key: str, default: str) -> str:
        value = self.get(key)
        if value is None:
            found = self._class_default(key)
            return found if isinstance(found, str) else default
        if not isinstance(value, str):
            raise ConfigError(self._field(key), f"expected a string, got {value!r}", "")
        return value

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self.get(key) or []
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
