"""The webhook over real TLS on loopback, called the way kube-apiserver calls it.

No kube-apiserver exists here, so ``ApiserverClient`` (tests/fixtures/admission) reproduces its
webhook client: caBundle-only trust, SAN ``dssup-webhook.dssup-system.svc`` with common-name
matching off, ALPN http/1.1, keep-alive, ``POST path?timeout=2s``, response verification, patch
application, failure policies and re-invocation. The cluster is an in-memory cache of fixtures.
"""

import base64
import json
import socket
import ssl
import time
import urllib.request

import pytest
from admission_helpers import (
    SAN,
    ApiserverClient,
    WebhookCallError,
    client_context,
    cluster_cache,
    load,
    make_ca,
    make_leaf,
    review,
)

from dssup.admission import Adapter, Policy
from dssup.admission.server import ServeOptions, start_background
from dssup.obs.metrics import PrometheusMetrics

pytestmark = pytest.mark.integration

EXPECTED = {  # fixture -> (allowed after mutate+validate, patched)
    "pytorchjob-dsv3-fits.yaml": (True, True),  # estimate annotation only
    "pytorchjob-dsv3-resize.yaml": (True, True),
    "trainjob-qwen2-hf.yaml": (True, True),
    "jobset-llama70b.yaml": (True, True),
    "job-annotations.yaml": (False, False),  # its knobs are job annotations the pods never see
    "pod-shell.yaml": (True, True),
    "job-deepspeed.yaml": (False, False),
    "job-cpu.yaml": (True, False),
}


def _serve(tmp_path, ca, **leaf):
    crt, key = make_leaf(ca, tmp_path, **leaf)
    cache = cluster_cache()
    metrics = PrometheusMetrics()
    bg = start_background(
        ServeOptions(cert_file=str(crt), key_file=str(key), max_body_bytes=1 << 20),
        Adapter(Policy(cache), metrics),
        cache,
        metrics,
    )
    return bg


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ca = make_ca()
    bg = _serve(tmp_path_factory.mktemp("tls"), ca)
    yield bg, ca
    bg.stop()


@pytest.fixture
def client(server):
    bg, ca = server
    c = ApiserverClient(bg.port, ca.pem())
    yield c
    c.close()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_kind_through_the_admission_chain(client, name):
    out = client.admit(load(name))
    allowed, patched = EXPECTED[name]
    assert out.allowed == allowed, out.message
    assert (out.patches > 0) == patched
    if not allowed:
        assert out.code == 403
        assert out.message.startswith(
            'admission webhook "validate.dssup.io" denied the request: dssup:'
        )


def test_resize_over_the_wire_then_validate_allows(client):
    out = client.admit(load("pytorchjob-dsv3-resize.yaml"))
    assert out.allowed and out.patches == 1 and out.calls == 3  # mutate, re-invocation, validate
    assert any(w.startswith("dssup: resized:") for w in out.warnings)
    ann = out.obj["metadata"]["annotations"]
    assert json.loads(ann["dssup.io/resized-to"])["microBatch"] < 8


def test_validate_only_denies_and_warn_path_only_warns(client):
    obj = load("pytorchjob-dsv3-resize.yaml")
    denied = client.admit(obj, mutate_path=None)
    assert not denied.allowed and "predicted peak" in denied.message
    warned = client.admit(obj, mutate_path=None, validate_path="/warn")
    assert warned.allowed and any("predicted OOM" in w for w in warned.warnings)


def test_update_delete_dry_run_generate_name(client):
    fits, big = load("pytorchjob-dsv3-fits.yaml"), load("pytorchjob-dsv3-resize.yaml")
    assert not client.admit(big, "UPDATE", old=fits).allowed
    assert client.admit(fits, "UPDATE", old=fits).allowed
    gone = client.admit(None, "DELETE", old=big)
    assert gone.allowed and gone.patches == 0
    dry = client.admit(big, dry_run=True)
    assert dry.allowed and dry.patches == 1
    anon = load("pytorchjob-dsv3-fits.yaml")
    anon["metadata"].pop("name")
    anon["metadata"]["generateName"] = "dsv3-"
    assert client.admit(anon).allowed


def test_validating_response_never_has_a_patch_and_uid_echoes(client):
    rev = review(load("pytorchjob-dsv3-resize.yaml"), uid="uid-echo-1")
    resp = client.call("/validate", rev, mutating=False)
    assert resp["uid"] == "uid-echo-1" and not resp["allowed"] and resp["status"]["code"] == 403
    resp = client.call("/mutate", review(load("pytorchjob-dsv3-resize.yaml")), mutating=True)
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert resp["patchType"] == "JSONPatch" and ops[0]["op"] == "test"


@pytest.mark.parametrize(
    "body, ctype, status",
    [
        (b"{not json", "application/json", 400),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}',
            "application/json",
            400,
        ),
        (b"{}", "text/plain", 415),
        (b"x" * ((1 << 20) + 10), "application/json", 413),
    ],
)
def test_bad_input_gets_4xx(client, body, ctype, status):
    got, raw = client.post("/mutate", body, content_type=ctype)
    assert got == status and "error" in json.loads(raw)


def test_odd_objects_get_an_allowed_review_with_a_warning(client):
    for obj in (
        {"kind": "RayJob", "metadata": {"name": "r"}},
        {"kind": "Job", "spec": "nonsense"},
        {"kind": "PyTorchJob", "spec": {"pytorchReplicaSpecs": {"Worker": 3}}},
    ):
        resp = client.call("/validate", review(obj, kind=obj["kind"]), mutating=False)
        assert resp["allowed"] is True


def test_paths_and_methods(server):
    bg, ca = server
    ctx = ssl.create_default_context(cadata=ca.pem().decode())
    ctx.check_hostname = False  # plain urllib dials 127.0.0.1; the name check is tested elsewhere
    with pytest.raises(urllib.error.HTTPError) as e404:
        urllib.request.urlopen(
            urllib.request.Request(
                f"https://127.0.0.1:{bg.port}/nope",
                data=b"{}",
                headers={"Content-Type": "application/json"},
            ),
            context=ctx,
        )
    assert e404.value.code == 404
    e404.value.close()
    with pytest.raises(urllib.error.HTTPError) as e405:
        urllib.request.urlopen(f"https://127.0.0.1:{bg.port}/mutate", context=ctx)
    assert e405.value.code == 405
    e405.value.close()


def test_health_ready_metrics(server, client):
    bg, _ = server
    client.admit(load("pytorchjob-dsv3-fits.yaml"))
    base = f"http://127.0.0.1:{bg.health_port}"
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(base + path) as resp:
            assert resp.status == 200
    with urllib.request.urlopen(f"{base}/metrics") as resp:
        text = resp.read().decode()
    assert (
        'dssup_admission_requests_total{code="fits",decision="patched",kind="PyTorchJob"}' in text
    )
    assert "dssup_admission_request_duration_seconds_bucket" in text


def test_negotiates_http11_and_tls12_plus(server):
    bg, ca = server
    c = ApiserverClient(bg.port, ca.pem())
    c.call("/validate", review(load("job-cpu.yaml")), mutating=False)
    sock = c._conn.sock
    assert sock.selected_alpn_protocol() == "http/1.1" and sock.version() in {"TLSv1.2", "TLSv1.3"}
    c.close()


@pytest.mark.parametrize("case", ["wrong-ca", "cn-only", "expired", "other-name"])
def test_tls_failures_are_rejected_like_kube_apiserver(tmp_path, case):
    ca, trusted = make_ca(), make_ca("another-ca")
    leaf = {
        "cn-only": {"sans": []},
        "expired": {"expired": True},
        "other-name": {"sans": ["other-webhook.dssup-system.svc"], "cn": "other"},
    }.get(case, {})
    bg = _serve(tmp_path, ca, **leaf)
    try:
        client = ApiserverClient(bg.port, (trusted if case == "wrong-ca" else ca).pem())
        with pytest.raises(WebhookCallError, match=r"certificate verify failed|match"):
            client.call("/validate", review(load("job-cpu.yaml")), mutating=False)
        # Failure policy: mutate fails open; validate fails closed only when configured so.
        assert client.admit(load("job-cpu.yaml"), validate_fail_closed=False).allowed
        assert not client.admit(load("job-cpu.yaml")).allowed
        client.close()
        good = ApiserverClient(bg.port, ca.pem(), server_name=SAN)
        if case == "wrong-ca":
            assert good.call("/validate", review(load("job-cpu.yaml")), mutating=False)["allowed"]
        good.close()
    finally:
        bg.stop()


def _jobset_too_big():
    obj = load("jobset-llama70b.yaml")
    args = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    args[args.index("--micro-batch-size") + 1] = "16"
    args[args.index("--global-batch-size") + 1] = "256"
    return obj


def _job_under_dssup_run():
    """The annotation-configured Job, its container run by ``dssup run`` (it reads DSSUP_*)."""
    obj = load("job-annotations.yaml")
    c = obj["spec"]["template"]["spec"]["containers"][0]
    c["command"] = ["dssup", "run", "--", *c["command"]]
    return obj


@pytest.mark.parametrize(
    "make",
    [
        lambda: load("pytorchjob-dsv3-resize.yaml"),
        lambda: load("trainjob-qwen2-hf.yaml"),
        _jobset_too_big,
        _job_under_dssup_run,
        lambda: load("pod-shell.yaml"),
    ],
    ids=["PyTorchJob", "TrainJob", "JobSet", "Job", "Pod"],
)
def test_every_kind_is_denied_without_mutation_and_resized_with_it(client, make):
    denied = client.admit(make(), mutate_path=None)
    assert not denied.allowed and denied.code == 403 and "predicted peak" in denied.message
    resized = client.admit(make())
    assert resized.allowed and resized.patches == 1
    assert "dssup.io/resized-to" in resized.obj["metadata"]["annotations"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: load("pytorchjob-dsv3-resize.yaml"),
        lambda: load("trainjob-qwen2-hf.yaml"),
        _jobset_too_big,
        _job_under_dssup_run,
        lambda: load("pod-shell.yaml"),
    ],
    ids=["PyTorchJob", "TrainJob", "JobSet", "Job", "Pod"],
)
def test_every_kind_update_delete_dry_run_generate_name(client, make):
    admitted = client.admit(make())
    assert admitted.allowed and admitted.patches == 1
    breaking = client.admit(make(), "UPDATE", old=admitted.obj, mutate_path=None)
    assert not breaking.allowed and breaking.code == 403
    unchanged = client.admit(admitted.obj, "UPDATE", old=admitted.obj)
    assert unchanged.allowed and unchanged.patches == 0
    gone = client.admit(None, "DELETE", old=admitted.obj)
    assert gone.allowed and gone.patches == 0
    dry = client.admit(make(), dry_run=True)
    assert dry.allowed and dry.obj == admitted.obj
    anon = make()
    anon["metadata"]["generateName"] = anon["metadata"].pop("name") + "-"
    named = client.admit(anon)
    assert named.allowed and named.patches == 1


def test_pipelined_requests_are_answered_in_order_each_in_one_piece(server):
    """Two reviews in one TLS write (HTTP/1.1 pipelining): both answered, in order, although the
    server now holds its writes until the end of each loop iteration (corked transport)."""
    bg, ca = server
    reqs = []
    for uid in ("pipe-1", "pipe-2"):
        body = json.dumps(review(load("pytorchjob-dsv3-fits.yaml"), uid=uid)).encode()
        head = (
            f"POST /validate?timeout=2s HTTP/1.1\r\nHost: {SAN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        reqs.append(head + body)
    ctx = client_context(ca.pem())
    with (
        socket.create_connection(("127.0.0.1", bg.port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=SAN) as tls,
    ):
        tls.sendall(b"".join(reqs))
        data = b""
        while data.count(b'"uid":') < 2:
            chunk = tls.recv(65536)
            assert chunk, "connection closed before both answers"
            data += chunk
    first, second = data.index(b'"uid":"pipe-1"'), data.index(b'"uid":"pipe-2"')
    assert first < second and data.count(b"HTTP/1.1 200") == 2


def test_what_a_review_leaves_behind_is_freed_after_the_answer(tmp_path):
    """The server tidies once each answer is written: the parsed requests and evicted memo
    entries an answer leaves behind (dssup/admission/evaluate.py ``Leftovers``) do not pile up."""
    ca = make_ca()
    crt, key = make_leaf(ca, tmp_path)
    cache = cluster_cache()
    adapter = Adapter(Policy(cache))
    opts = ServeOptions(cert_file=str(crt), key_file=str(key))
    bg = start_background(opts, adapter, cache, PrometheusMetrics())
    client = ApiserverClient(bg.port, ca.pem())
    try:
        job = load("pytorchjob-dsv3-fits.yaml")
        for run in range(5):
            job["metadata"]["name"] = f"dsv3-{run}"
            job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
                "env"
            ] = [{"name": "RUN_ID", "value": str(run)}]
            assert client.admit(job).allowed
        deadline = time.monotonic() + 5
        while len(adapter.policy.leftovers) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(adapter.policy.leftovers) == 0
    finally:
        client.close()
        bg.stop()
