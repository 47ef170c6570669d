"""Reading sizes the user types: ``80GiB``, ``80GB``, ``512MiB`` or a byte count.

A memory capacity never comes as a bare number: ``--gpu-memory 80`` once meant 80 bytes, and a
capacity read wrongly by a factor of 2^30 makes every answer wrong. So a memory amount
(``parse_size`` in ``gpus.py``, which also reads GPU names) refuses a bare number with the likely
fix ("80: did you mean 80GiB?"); ``parse_bytes`` is for fields that are byte counts by nature (an
HTTP body limit), where a bare number is bytes. Binary units (KiB, MiB, GiB, TiB and Kubernetes'
Ki, Mi, Gi, Ti) are powers of 2, decimal ones (KB, MB, GB, TB) powers of 10; a single letter
(K, M, G, T) is binary, as ``G`` always was here. ``B`` marks a byte count (``1024B``).
"""

from __future__ import annotations

import re

from dssup.errors import ConfigError

__all__ = ["SIZE_HINT", "UNIT_HINT", "parse_bytes", "parse_quantity", "positive"]

_G = 1 << 30
_UNITS = {
    "b": 1,
    "k": 1 << 10,
    "kb": 10**3,
    "kib": 1 << 10,
    "ki": 1 << 10,
    "m": 1 << 20,
    "mb": 10**6,
    "mib": 1 << 20,
    "mi": 1 << 20,
    "g": _G,
    "gb": 10**9,
    "gib": _G,
    "gi": _G,
    "t": 1 << 40,
    "tb": 10**12,
    "tib": 1 << 40,
    "ti": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]{0,20}\.?[0-9]{1,20})\s*([a-zA-Z]{0,8})\s*$")
SIZE_HINT = "write a unit (80GiB, 80GB, 512MiB, 1024B) or a GPU name such as H100 (see dssup gpus)"
UNIT_HINT = "write a unit (80GiB, 80GB, 512MiB, 1024B)"  # where a GPU name means nothing


def parse_quantity(
    text: str, field: str, bare_unit: int | None, hint: str = SIZE_HINT
) -> int | None:
    """Bytes of ``<number><unit>``; None if ``text`` is not of that shape. A bare number is
    ``bare_unit`` bytes each, or (``bare_unit`` None) refused with the likely fix (``hint``)."""
    match = _SIZE.match(text)
    if not match:
        return None
    number, unit = match.group(1), match.group(2).lower()
    if not unit:
        if bare_unit is None and float(number) == 0:
            return 0  # zero needs no unit
        if bare_unit is None:
            raise ConfigError(field, f"{text.strip()}: did you mean {text.strip()}GiB?", hint)
        return int(float(number) * bare_unit)
    if unit not in _UNITS:
        raise ConfigError(field, f"unknown unit {match.group(2)!r} in {text!r}", hint)
    return int(float(number) * _UNITS[unit])


def parse_bytes(text: str, field: str = "size") -> int:
    """Bytes of a byte count: a bare number is bytes (``1048576``); units work as above."""
    value = parse_quantity(text, field, 1)
    if value is None:
        raise ConfigError(field, f"cannot read {text!r} as a byte count", "write e.g. 3MiB")
    return positive(value, text, field, False)


def positive(value: int, text: str, field: str, zero: bool) -> int:
    if value < 0 or (value == 0 and not zero):
        raise ConfigError(
            field, f"{text!r} is not positive", "give a size above zero" if not zero else ""
        )
    return value
