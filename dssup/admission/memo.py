"""Remember judgements: the same job is judged several times, and re-judging it is wasted work.

One job reaches the webhook again and again with nothing that matters changed: the mutating
webhook, its re-invocation and the validating webhook see it at CREATE; controllers then UPDATE
it (finalizers, labels, annotations) many times over its life; sweeps submit one template under
many names. A decision depends only on the object's content (minus the fields the apiserver or
the user change freely: name, uid, resourceVersion, timestamps, managedFields, status, and
annotations outside ``dssup.io/``), the namespace, the webhook mode and the cluster cache's
content. So ``content`` serialises exactly that, with the cache's *generation* (bumped by the
cache whenever something a decision can read changes), and ``memo_key`` keys it per scope. The
validating webhook does not read what the mutating one wrote (``dssup.io/estimate``,
``resized-from``, ``resized-to``), so those are left out of its content: validate after mutate
hits. ``Policy`` keeps decisions per webhook mode, and ``Evaluator`` the mode-free evaluations
the mutating webhook made, each in a bounded LRU.

Correctness rule, tested by a property test: two objects that differ only in what the key
leaves out always get the same decision from a policy without a memo.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import orjson

from dssup.admission import annotations as ann

__all__ = [
    "VOLATILE_META",
    "WRITTEN",
    "Versioned",
    "carries_written",
    "content",
    "memo_key",
]

VOLATILE_META = frozenset(
    {
        "name",
        "generateName",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "finalizers",
    }
)


WRITTEN = frozenset({ann.ESTIMATE, ann.RESIZED_FROM, ann.RESIZED_TO})


@runtime_checkable
class Versioned(Protocol):
    """A cluster cache that counts changes to what decisions read (``InMemoryCache`` does)."""

    def generation(self) -> int: ...


def _annotations(value: Any, keep_written: bool) -> Any:
    if not isinstance(value, Mapping):
        return value  # absent or odd: the exact value decides how a patch must add them
    skip = frozenset() if keep_written else WRITTEN
    kept = {k: v for k, v in value.items() if k.startswith(ann.PREFIX) and k not in skip}
    return [True, kept]  # present (the mutating patch adds to it rather than creating it)


def _stable(obj: Mapping[str, Any], keep_written: bool) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        kept = {k: v for k, v in meta.items() if k not in VOLATILE_META}
        if "annotations" in kept:
            kept["annotations"] = _annotations(kept["annotations"], keep_written)
        out["metadata"] = kept
    return out


def content(
    obj: Mapping[str, Any], namespace: str, generation: int, *, keep_written: bool
) -> bytes | None:
    """What a result depends on, as bytes; None when the object cannot be serialised (values
    JSON cannot carry), in which case the caller simply judges it. Only the mutating webhook
    reads the annotations dssup writes (``keep_written``): its patch must not repeat them."""
    try:
        return orjson.dumps([namespace, generation, _stable(obj, keep_written)])
    except TypeError:
        return None


def carries_written(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` holds an annotation dssup writes (else both contents are equal)."""
    meta = obj.get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(found, Mapping) and any(k in found for k in WRITTEN)


RAW_KEY_MAX = 4096


def memo_key(scope: str, raw: bytes) -> tuple[str, bytes] | tuple[str, bytes, int]:
    """The key of ``raw`` for one ``scope``: a webhook mode, or ``"evaluate"`` for the mode-free
    evaluation (view, config, GPU, estimate) the webhooks share.

    A content up to ``RAW_KEY_MAX`` bytes (a typical job) is its own key: bytes keep their hash,
    so the decision and evaluation memos hash one content once, and no two contents can ever
    share a key. A longer one (a JobSet of many templates) is keyed by its 16-byte BLAKE2b
    digest and length, so thousands of entries do not hold megabytes of keys."""
    if len(raw) <= RAW_KEY_MAX:
        return scope, raw
    return scope, hashlib.blake2b(raw, digest_size=16).digest(), len(raw)
