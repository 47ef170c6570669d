"""The server under load and shutdown (issue 15, item 5), over real TLS on loopback.

* SIGTERM with 16 idle keep-alive connections (what kube-apiserver holds): the process exits
  within ``--drain`` + 1 s (before, every rollout waited for SIGKILL after 30 s);
* a 2.8 MB review (a long ``bash -c`` launch script) does not delay a small review on another
  connection past 100 ms (large bodies are judged off the event loop, and launch-line elements
  over 32 KiB are not scanned);
* JSON nested 5,000 deep gets 400 (not a 500 from RecursionError);
* 300 half-sent requests are closed after the read timeout; too many header bytes get 431.

Timing assertions have margins for a loaded 2-core machine: each is the best of up to three
tries, because a try can only fail by being slow, never by being fast. Every server started is
stopped (a process is killed if it outlives its test).
"""

import json
import signal
import socket
import ssl
import threading
import time

import pytest
from admission_helpers import (
    SAN,
    _Conn,
    client_context,
    cluster_cache,
    load,
    make_ca,
    make_leaf,
    review,
    serve_process,
    wait_ready,
)

from dssup.admission import Adapter, Policy
from dssup.admission.server import ServeOptions, start_background

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    ca = make_ca()
    crt, key = make_leaf(ca, tmp_path_factory.mktemp("limits"))
    return ca, crt, key


def _post(conn, body, path="/validate"):
    conn.request(
        "POST", f"{path}?timeout=2s", body=body, headers={"Content-Type": "application/json"}
    )
    r = conn.getresponse()
    return r.status, r.read()


def _sigterm_exit_seconds(tls, drain):
    ca, crt, key = tls
    proc, port, health = serve_process(crt, key, drain=str(drain))
    conns = []
    try:
        wait_ready(proc, health)
        body = json.dumps(review(load("pytorchjob-dsv3-fits.yaml"))).encode()
        for _ in range(16):
            c = _Conn(port, client_context(ca.pem()), SAN, 10)
            c.connect()
            assert _post(c, body)[0] == 200
            conns.append(c)  # idle, kept alive (as kube-apiserver keeps them)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(40)
        return time.monotonic() - start, proc.returncode
    finally:
        for c in conns:
            c.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_with_16_idle_keep_alive_connections_exits_within_drain_plus_1s(tls):
    drain = 1.0
    tries = []
    for _ in range(3):
        seconds, rc = _sigterm_exit_seconds(tls, drain)
        assert rc == 0
        tries.append(seconds)
        if seconds <= drain + 1.0:
            break
    assert min(tries) <= drain + 1.0, tries


@pytest.fixture(scope="module")
def server(tls):
    ca, crt, key = tls
    opts = ServeOptions(
        cert_file=str(crt), key_file=str(key), header_timeout_s=1.0, body_timeout_s=1.0
    )
    bg = start_background(opts, Adapter(Policy(cluster_cache())), cluster_cache())
    yield bg, ca
    bg.stop()


def _big_review(run=0):
    """A 2.8 MB review: a Pod whose ``bash -c`` script is 75,000 steps long (``run`` makes the
    content new, so the webhook's memory cannot answer it)."""
    obj = load("pod-shell.yaml")
    steps = " ".join(f"echo step{i} --flag{i} value{i}" for i in range(75_000))
    obj["spec"]["containers"][0]["args"][0] += f" ; echo run{run} ; " + steps
    body = json.dumps(review(obj)).encode()
    assert 2_700_000 < len(body) < 3_000_000
    return body


def _overlapped_small_latency(bg, ca, big):
    """The slowest small review sent while the big one was being judged (None if none)."""
    small = json.dumps(review(load("pytorchjob-dsv3-fits.yaml"))).encode()
    a = _Conn(bg.port, client_context(ca.pem()), SAN, 10)
    b = _Conn(bg.port, client_context(ca.pem()), SAN, 10)
    a.connect()
    b.connect()
    _post(b, small)  # warm: the small job's answer is remembered, as in production
    done = threading.Event()
    result = {}

    def send_big():
        result["big"] = _post(a, big)
        done.set()

    try:
        t = threading.Thread(target=send_big)
        t.start()
        worst = None
        while not done.is_set():
            start = time.monotonic()
            status, _ = _post(b, small)
            took = time.monotonic() - start
            assert status == 200
            if not done.is_set():  # answered while the big one was still pending
                worst = max(worst or 0.0, took)
        t.join(30)
        status, out = result["big"]
        assert status == 200 and json.loads(out)["response"]["allowed"] is True
        return worst
    finally:
        a.close()
        b.close()


def test_a_large_review_does_not_delay_small_ones(server):
    bg, ca = server
    tries = []
    for run in range(3):
        worst = _overlapped_small_latency(bg, ca, _big_review(run))
        tries.append(worst)
        if worst is not None and worst < 0.1:
            break
    measured = [w for w in tries if w is not None]
    assert measured and min(measured) < 0.1, tries


def test_deeply_nested_json_is_400(server):
    bg, ca = server
    c = _Conn(bg.port, client_context(ca.pem()), SAN, 10)
    try:
        deep = (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",'
            b'"object":' + b"[" * 5000 + b"]" * 5000 + b"}}"
        )
        status, out = _post(c, deep)
        assert status == 400 and b"nested" in out
    finally:
        c.close()


def _tls_socket(port, ca):
    ctx = client_context(ca.pem())
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=SAN)


def _closed_by_server(sock, until):
    sock.settimeout(max(0.01, until - time.monotonic()))
    try:
        return sock.recv(1024) == b""
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def test_half_sent_requests_are_closed_after_the_read_timeout(server):
    bg, ca = server
    socks = []
    try:
        for i in range(300):
            s = _tls_socket(bg.port, ca)
            if i % 2:  # headers never finished
                s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
            else:  # headers done, body short of its content-length
                s.sendall(
                    b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 1000\r\n\r\n{"apiVersion":'
                )
            socks.append(s)
        sent = time.monotonic()
        deadline = sent + 1.0 + 10.0  # read timeout 1 s, generous margin for a loaded machine
        closed = sum(_closed_by_server(s, deadline) for s in socks)
        assert closed == 300
    finally:
        for s in socks:
            s.close()


def test_oversized_headers_get_431(server):
    bg, ca = server
    s = _tls_socket(bg.port, ca)
    try:
        headers = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"v" * 100) for i in range(400))
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        data = b""
        s.settimeout(10)
        while chunk := s.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 431")
    finally:
        s.close()


class _SlowJudge(Adapter):
    """An adapter whose judgement waits until the test has its answer: a judgement past the
    deadline on any machine. (With the real judgement the test depended on a 2.8 MB review
    parsing within a 5 ms deadline and judging beyond it: on a loaded machine the parse took
    longer, so the server waited for the uid and answered with the full judgement.) Parsing
    the review stays real."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.release = threading.Event()

    def decide(self, req, mode):  # type: ignore[no-untyped-def]
        self.release.wait(60)
        return super().decide(req, mode)


def test_a_review_past_the_deadline_is_allowed_with_a_warning(tls):
    ca, crt, key = tls
    opts = ServeOptions(cert_file=str(crt), key_file=str(key), judge_deadline_s=2.0)
    adapter = _SlowJudge(Policy(cluster_cache()))
    bg = start_background(opts, adapter, cluster_cache())
    c = _Conn(bg.port, client_context(ca.pem()), SAN, 10)
    try:
        start = time.monotonic()
        status, out = _post(c, _big_review())
        took = time.monotonic() - start
        resp = json.loads(out)["response"]
        assert status == 200 and resp["allowed"] is True
        assert resp["warnings"] == ["dssup: not judged within 2 s (a very large object); allowed"]
        assert took < 30, "answered at the deadline, not when the judgement ended"
    finally:
        adapter.release.set()
        c.close()
        bg.stop()
