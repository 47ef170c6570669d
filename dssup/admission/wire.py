"""AdmissionReview ``admission.k8s.io/v1`` on the wire: parse what kube-apiserver sends and
build exactly what it accepts.

Kept free of policy so the rules kube-apiserver applies to a response (same ``uid``, same
``apiVersion``/``kind``, ``patch`` only together with ``patchType: JSONPatch``, denial codes
>= 400) live in one small, tested place. Parsing is strict only where an answer is impossible
without the field (a JSON object with ``request.uid``); everything else is read leniently and
judged by the policy, so odd objects get an allowed answer with a warning instead of a 4xx.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from dssup.errors import MalformedReview

__all__ = [
    "API_VERSION",
    "AdmissionRequest",
    "clean",
    "copy_json",
    "dumps",
    "encode_patch",
    "loads",
    "parse_review",
    "response_document",
]

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})


def loads(body: bytes | str) -> Any:
    """orjson (half the time of json) with the standard library as the fallback for what orjson
    refuses (integers beyond 64 bits); raises ``ValueError`` for text that is not JSON or that
    nests deeper than orjson's 1,024 levels (the fallback would recurse until RecursionError)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc).lower():
            raise ValueError("JSON nested deeper than 1024 levels") from None
        try:
            return json.loads(body)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None


def dumps(doc: Any) -> bytes:
    """Compact JSON bytes (orjson; the standard library for what orjson refuses)."""
    try:
        return orjson.dumps(doc)
    except TypeError:
        return json.dumps(doc, separators=(",", ":")).encode()


def copy_json(doc: Any) -> Any:
    """A deep copy of JSON data, several times faster than ``copy.deepcopy``."""
    return loads(dumps(doc))


class AdmissionRequest(NamedTuple):
    """The fields of ``request`` that dssup reads; ``obj`` is None on DELETE."""

    uid: str
    group: str
    version: str
    kind: str
    resource: str
    sub_resource: str
    namespace: str
    name: str
    operation: str
    obj: dict[str, Any] | None
    old_obj: dict[str, Any] | None
    dry_run: bool
    username: str


def _is_map(value: Any) -> bool:
    """``isinstance(value, Mapping)`` without the ABC check for the usual parsed ``dict``."""
    return type(value) is dict or isinstance(value, Mapping)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _gvk(value: Any) -> tuple[str, str, str]:
    if not _is_map(value):
        return "", "", ""
    return _str(value.get("group")), _str(value.get("version")), _str(value.get("kind"))


def _obj(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def parse_review(body: bytes | str | Mapping[str, Any]) -> AdmissionRequest:
    """Parse an AdmissionReview; raise ``MalformedReview`` when no valid answer can be built."""
    if not isinstance(body, (bytes, str)):
        doc: Any = body
    else:
        try:
            doc = loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedReview(f"body is not JSON: {exc}") from None
    if not _is_map(doc):
        raise MalformedReview("body is not a JSON object")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise MalformedReview(
            f"expected apiVersion {API_VERSION} kind {KIND}, got "
            f"{doc.get('apiVersion')!r} {doc.get('kind')!r}"
        )
    req = doc.get("request")
    if not _is_map(req):
        raise MalformedReview("request is missing or not an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid is missing or not a string")
    group, version, kind = _gvk(req.get("kind"))
    resource = req.get("resource")
    user = req.get("userInfo")
    return AdmissionRequest(  # positional, in field order: several times cheaper than keywords
        uid,
        group,
        version,
        kind,
        _str(resource.get("resource")) if _is_map(resource) else "",
        _str(req.get("subResource")),
        _str(req.get("namespace")),
        _str(req.get("name")),
        _str(req.get("operation")),
        _obj(req.get("object")),
        _obj(req.get("oldObject")),
        req.get("dryRun") is True,
        _str(user.get("username")) if _is_map(user) else "",
    )


# C0 and C1 control characters and DEL: echoed text goes into HTTP Warning headers and logs.
_CONTROL = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0)])


def clean(text: str) -> str:
    """``text`` without control characters (a job's own strings are echoed in answers)."""
    return text.translate(_CONTROL) if not text.isprintable() else text


def encode_patch(ops: Sequence[Mapping[str, Any]]) -> str:
    """RFC 6902 operations as the base64 string ``response.patch`` carries."""
    return base64.b64encode(dumps(list(ops))).decode("ascii")


def response_document(
    uid: str,
    allowed: bool,
    *,
    patch: Sequence[Mapping[str, Any]] = (),
    warnings: Sequence[str] = (),
    code: int = 403,
    message: str = "",
    reason: str = "Forbidden",
    audit: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A complete AdmissionReview response. A patch is only attached to an allowed answer."""
    resp: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if allowed and patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = encode_patch(patch)
    if not allowed:
        resp["status"] = {"code": max(code, 400), "reason": reason, "message": clean(message)}
    if warnings:
        resp["warnings"] = [clean(w) for w in warnings]
    if audit:
        resp["auditAnnotations"] = dict(audit)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": resp}
