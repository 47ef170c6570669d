"""A small, fast RFC 6902 applier for the operations dssup emits (add, replace, remove, test).

Used only to *verify* a resize inside the request (apply to a copy, re-read the result), where
the general ``jsonpatch`` library dominated the cost. Tests apply every patch with ``jsonpatch``
as well (and kube-apiserver applies it with evanphx/json-patch), so the two are cross-checked.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PatchError", "apply_ops"]


class PatchError(ValueError):
    """An operation that does not apply (missing path, failed test, bad index)."""


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"bad pointer {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _index(container: list[Any], token: str, *, append: bool) -> int:
    if append and token == "-":  # noqa: S105 (the RFC 6902 end-of-array marker)
        return len(container)
    if not (token.isascii() and token.isdigit()) or (len(token) > 1 and token[0] == "0"):
        raise PatchError(f"bad array index {token!r}")
    i = int(token)
    if i > len(container) or (not append and i == len(container)):
        raise PatchError(f"index {i} out of range")
    return i


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for t in tokens[:-1]:
        if isinstance(node, dict):
            if t not in node:
                raise PatchError(f"missing member {t!r}")
            node = node[t]
        elif isinstance(node, list):
            node = node[_index(node, t, append=False)]
        else:
            raise PatchError("path goes through a scalar")
    return node


def _apply_one(doc: Any, op: dict[str, Any]) -> Any:
    kind, tokens = op.get("op"), _tokens(str(op.get("path", "")))
    if not tokens:
        if kind == "test" and doc != op.get("value"):
            raise PatchError("test failed at the root")
        return op.get("value") if kind in ("add", "replace") else doc
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        exists = last in parent
        if kind == "add" or (kind == "replace" and exists):
            parent[last] = op["value"]
        elif kind == "remove" and exists:
            del parent[last]
        elif kind == "test" and exists and parent[last] == op.get("value"):
            pass
        else:
            raise PatchError(f"{kind} failed at {op.get('path')}")
    elif isinstance(parent, list):
        i = _index(parent, last, append=kind == "add")
        if kind == "add":
            parent.insert(i, op["value"])
        elif kind == "replace":
            parent[i] = op["value"]
        elif kind == "remove":
            del parent[i]
        elif kind != "test" or parent[i] != op.get("value"):
            raise PatchError(f"{kind} failed at {op.get('path')}")
    else:
        raise PatchError("path goes through a scalar")
    return doc


def apply_ops(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply ``ops`` to ``doc`` in place (pass a copy) and return the result."""
    for op in ops:
        doc = _apply_one(doc, op)
    return doc
