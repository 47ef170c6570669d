"""Memory of common training GPUs, and parsing of sizes such as ``80GiB`` or ``H100-80GB``.

Pure data: used by the CLI, the webhook (as a fallback when Node labels are missing) and the
planner's callers. Capacities are the marketed sizes in bytes (H100 80GB = 80 GiB of HBM3).
"""

from __future__ import annotations

import re

from dssup.errors import ConfigError

__all__ = ["GPU_MEMORY", "parse_size"]

_G = 1 << 30
GPU_MEMORY: dict[str, int] = {
    "a100-40gb": 40 * _G,
    "a100-80gb": 80 * _G,
    "h100-80gb": 80 * _G,
    "h100": 80 * _G,
    "h800": 80 * _G,
    "h20": 96 * _G,
    "h200": 141 * 10**9,
    "b200": 180 * 10**9,
    "gb200": 186 * 10**9,
    "l40s": 48 * _G,
    "a10g": 24 * _G,
    "mi300x": 192 * _G,
    "v100-32gb": 32 * _G,
}
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 1 << 10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 1 << 20,
    "g": _G,
    "gb": 10**9,
    "gib": _G,
    "t": 1 << 40,
    "tb": 10**12,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, field: str = "size") -> int:
    """Bytes from ``80GiB`` (2^30), ``80GB`` (10^9), ``80G`` (GiB), a plain byte count, or a GPU
    name from ``GPU_MEMORY`` (``H100``, ``a100-40gb``)."""
    key = text.strip().lower()
    if key in GPU_MEMORY:
        return GPU_MEMORY[key]
    match = _SIZE.match(key)
    if not match or match.group(2) not in _UNITS:
        raise ConfigError(
            field,
            f"cannot read {text!r} as a size",
            "write e.g. 80GiB, 80GB, 85899345920 or a GPU name such as H100",
        )
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value <= 0:
        raise ConfigError(field, f"{text!r} is not positive", "give a size above zero")
    return int(value)
