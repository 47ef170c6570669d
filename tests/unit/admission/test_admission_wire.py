"""AdmissionReview v1 parsing and response building, checked against the wire format."""

import base64
import json

import pytest
from admission_helpers import load, review

from dssup.admission import Adapter, InMemoryCache, Policy
from dssup.admission.wire import encode_patch, parse_review, response_document
from dssup.errors import MalformedReview


def test_patch_encoding_is_base64_of_the_operations_as_json():
    ops = [{"op": "add", "path": "/spec/replicas", "value": 3}]
    # The Kubernetes docs' example encodes the same operations with spaces after separators;
    # kube-apiserver decodes the JSON, so only the decoded operations must match.
    docs = "W3sib3AiOiAiYWRkIiwgInBhdGgiOiAiL3NwZWMvcmVwbGljYXMiLCAidmFsdWUiOiAzfV0="
    encoded = encode_patch(ops)
    assert encoded == base64.b64encode(b'[{"op":"add","path":"/spec/replicas","value":3}]').decode()
    assert json.loads(base64.b64decode(encoded)) == json.loads(base64.b64decode(docs)) == ops
    big = [{"op": "add", "path": "/x", "value": 2**70}]  # beyond orjson's 64-bit integers
    assert json.loads(base64.b64decode(encode_patch(big))) == big


def test_parse_reads_the_fields_the_policy_needs():
    obj = load("pytorchjob-dsv3-fits.yaml")
    req = parse_review(json.dumps(review(obj, dry_run=True, uid="u-1")).encode())
    assert (req.uid, req.kind, req.group, req.operation, req.dry_run) == (
        "u-1",
        "PyTorchJob",
        "kubeflow.org",
        "CREATE",
        True,
    )
    assert req.obj == obj and req.old_obj is None and req.username == "alice"


def test_delete_has_a_null_object():
    obj = load("job-cpu.yaml")
    req = parse_review(review(None, "DELETE", old=obj))
    assert req.obj is None and req.old_obj == obj


@pytest.mark.parametrize(
    "body, why",
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}}',
            "expected apiVersion",
        ),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request is missing"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}',
            "request.uid",
        ),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_unanswerable_bodies_raise_malformed_review(body, why):
    with pytest.raises(MalformedReview, match=why):
        parse_review(body)


def test_odd_fields_are_read_leniently():
    doc = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "x", "kind": "Job", "object": [1], "userInfo": "bob", "dryRun": "yes"},
    }
    req = parse_review(doc)
    assert (req.kind, req.obj, req.username, req.dry_run) == ("", None, "", False)


def test_allowed_response_with_patch_carries_patch_type():
    doc = response_document(
        "u", True, patch=[{"op": "add", "path": "/a", "value": 1}], warnings=["w"]
    )
    resp = doc["response"]
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    assert resp["patchType"] == "JSONPatch" and resp["warnings"] == ["w"]
    assert json.loads(base64.b64decode(resp["patch"])) == [{"op": "add", "path": "/a", "value": 1}]
    assert "status" not in resp


def test_denial_has_status_code_at_least_400_and_never_a_patch():
    resp = response_document(
        "u", False, patch=[{"op": "add", "path": "/a", "value": 1}], code=200, message="no"
    )["response"]
    assert resp["status"] == {"code": 400, "reason": "Forbidden", "message": "no"}
    assert "patch" not in resp and "patchType" not in resp


def test_minimal_allow():
    assert response_document("u", True) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u", "allowed": True},
    }


def test_json_helpers_fall_back_for_what_orjson_refuses():
    from dssup.admission.wire import copy_json, dumps, loads

    big = {"n": 2**70, "s": "é"}
    assert loads(dumps(big)) == big and copy_json(big) == big and copy_json(big) is not big
    assert loads(b'{"x": NaN}')["x"] != 0  # the standard library accepts what orjson rejects
    with pytest.raises(ValueError):
        loads(b"{oops")


def test_control_characters_are_stripped_from_echoed_text():
    doc = response_document(
        "u",
        False,
        warnings=["dssup: model 'x\x1b[31m\r\nSet-Cookie: y'\x00\x85"],
        message="a\nb\x07",
    )
    resp = doc["response"]
    assert resp["warnings"] == ["dssup: model 'x[31mSet-Cookie: y'"]
    assert resp["status"]["message"] == "ab"


def test_deeply_nested_json_is_a_malformed_review_not_a_recursion_error():
    deep = (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",'
        b'"object":' + b"[" * 5000 + b"]" * 5000 + b"}}"
    )
    with pytest.raises(MalformedReview, match="nested"):
        parse_review(deep)
    status, body = Adapter(Policy(InMemoryCache())).handle("validate", deep)
    assert status == 400 and b"nested" in body
