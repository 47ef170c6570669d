"""Kubernetes publishing fails soft. kube-apiserver cannot run here, so a loopback HTTP server
records what the real ``kubernetes`` client sends (an Event, a merge patch of annotations)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

from dssup.supervisor.multinode.kube import EventPublisher


class _Api(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str, Any]]] = []
    status: ClassVar[int] = 201

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append((self.command, self.path, json.loads(body or b"{}")))
        if self.command == "PATCH":  # a pod needs no required fields to deserialize
            body = b'{"metadata": {"name": "p"}}'
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        # like kube-apiserver: the created/patched object back, or a Status on failure
        self.wfile.write(b'{"kind": "Status", "metadata": {}}' if self.status >= 400 else body)

    do_POST = do_PATCH = _handle

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def api() -> Iterator[str]:
    _Api.seen.clear()
    server = HTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _client(host: str) -> Any:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = host
    return lambda: client.ApiClient(cfg)


def test_outside_a_pod_nothing_is_sent() -> None:
    pub = EventPublisher(env={})
    assert not pub.enabled
    assert pub.publish("Generation", "x", {"a": "b"}) is False


def test_event_and_annotations_reach_the_apiserver(api: str) -> None:
    _Api.status = 201
    pub = EventPublisher(api_client=_client(api), pod="job-worker-0", namespace="team", env={})
    assert pub.publish("Generation", "world 2: rescale", {"dssup.io/generation": "3"})
    (m1, p1, event), (m2, p2, patch) = _Api.seen
    assert (m1, p1) == ("POST", "/api/v1/namespaces/team/events")
    assert event["reason"] == "Generation" and event["involvedObject"]["name"] == "job-worker-0"
    assert event["source"]["component"] == "dssup"
    assert (m2, p2) == ("PATCH", "/api/v1/namespaces/team/pods/job-worker-0")
    assert patch == {"metadata": {"annotations": {"dssup.io/generation": "3"}}}


def test_forbidden_switches_publishing_off_without_raising(api: str) -> None:
    _Api.status = 403
    pub = EventPublisher(api_client=_client(api), pod="p", namespace="n", env={})
    assert pub.publish("Generation", "x", {}) is False
    assert not pub.enabled
    assert pub.publish("Generation", "y", {}) is False
    assert len(_Api.seen) == 1  # one try, then off
