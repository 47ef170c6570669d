"""Short text for people: error messages cut at a word, never mid-word.

Journals keep every message whole; the console, the summary and ``dssup status`` show a line.
Cutting at a fixed character count split words and numbers ("DefaultCPUAllocator: can't
allocate memory: you tried to allocate 335"), which reads as a different number.
"""

from __future__ import annotations

__all__ = ["clip", "one_line"]


def one_line(text: str) -> str:
    """All whitespace runs (newlines included) folded to single spaces."""
    return " ".join(text.split())


def clip(text: str, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word boundary with '...'."""
    flat = one_line(text)
    if len(flat) <= limit:
        return flat
    cut = flat[: max(1, limit - 3)]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "..."
