"""Remember judgements: the same job is judged several times, and re-judging it is wasted work.

One job reaches the webhook again and again with nothing that matters changed: the mutating
webhook, its re-invocation and the validating webhook see it at CREATE; controllers then UPDATE
it (finalizers, labels, annotations) many times over its life; sweeps submit one template under
many names. A decision depends only on the object's content (minus the fields the apiserver or
the user change freely: name, uid, resourceVersion, timestamps, managedFields, status, and
annotations outside ``dssup.io/``), the namespace, the webhook mode and the cluster cache's
content. The validating webhook does not read what the mutating one wrote (``dssup.io/estimate``,
``resized-from``, ``resized-to``), so those are left out of its key: validate after mutate hits. So ``judgement_key`` hashes exactly
that, with the cache's *generation* (bumped by the cache whenever something a decision can read
changes). ``Policy`` keeps decisions per webhook mode, and ``Evaluator`` keeps the mode-free
evaluations, each in a bounded LRU.

Correctness rule, tested by a property test: two objects that differ only in what the key
leaves out always get the same decision from a policy without a memo.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import orjson

from dssup.admission import annotations as ann

__all__ = ["VOLATILE_META", "WRITTEN", "Versioned", "judgement_key"]

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


def _annotations(value: Any, scope: str) -> Any:
    if not isinstance(value, Mapping):
        return value  # absent or odd: the exact value decides how a patch must add them
    skip = WRITTEN if scope != "mutate" else frozenset()
    kept = {k: v for k, v in value.items() if k.startswith(ann.PREFIX) and k not in skip}
    return [True, kept]  # present (the mutating patch adds to it rather than creating it)


def _stable(obj: Mapping[str, Any], scope: str) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        kept = {k: v for k, v in meta.items() if k not in VOLATILE_META}
        if "annotations" in kept:
            kept["annotations"] = _annotations(kept["annotations"], scope)
        out["metadata"] = kept
    return out


def judgement_key(
    obj: Mapping[str, Any], namespace: str, mode: str, generation: int
) -> bytes | None:
    """16 bytes naming everything a decision depends on; None when the object cannot be hashed
    (values JSON cannot carry), in which case the caller simply judges it."""
    try:
        raw = orjson.dumps([mode, namespace, generation, _stable(obj, mode)])
    except TypeError:
        return None
    return hashlib.blake2b(raw, digest_size=16).digest()
