"""The watch caches and ``dssup webhook serve`` as a real process.

No kube-apiserver can run here; ``FakeApiserver`` serves just the list and watch endpoints the
caches use (JSON lists with a resourceVersion, newline-delimited watch events, 404 for CRDs that
are not installed), so the real ``kubernetes`` client code path is exercised end to end.
"""

import json
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import pytest
from admission_helpers import (
    ApiserverClient,
    load,
    make_ca,
    make_leaf,
    serve_process,
    wait_ready,
)
from kubernetes import client

from dssup.admission.cache import InMemoryCache
from dssup.admission.kube_cache import KubeWatchCache

pytestmark = pytest.mark.integration


def _node(name, product, mib, rv):
    return {
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(mib)},
        }
    }


# An MI300X node as AMD's ROCm node labeller labels it (k8s-device-plugin @ ed7646843003).
AMD_NODE = {
    "metadata": {
        "name": "mi300x-1",
        "resourceVersion": "8",
        "labels": {
            "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
            "amd.com/gpu.vram": "192G",
            "beta.amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
            "beta.amd.com/gpu.product-name.AMD_Instinct_MI300X_OAM": "8",
            "beta.amd.com/gpu.vram": "192G",
            "beta.amd.com/gpu.vram.192G": "8",
        },
    }
}


def _selected(items, q):
    """What a ``labelSelector=<key>`` (label exists) list or watch returns."""
    key = (q.get("labelSelector") or [""])[0]
    return [i for i in items if not key or key in i["metadata"]["labels"]]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[str]] = []

    def log_message(self, *args):  # keep test output clean
        return

    def _send(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        self.seen.append(self.path)
        watching = q.get("watch") == ["true"]
        if url.path.startswith("/apis/trainer.kubeflow.org/"):
            return self._send(
                404,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                    "message": "not found",
                },
            )
        if url.path == "/api/v1/nodes" and not watching:
            return self._send(
                200,
                {
                    "kind": "NodeList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": "10"},
                    "items": _selected([_node("h800-1", "NVIDIA-H800", 81559, "9"), AMD_NODE], q),
                },
            )
        if url.path.startswith("/api/v1/namespaces/") and not watching:
            ns = url.path.split("/")[4]
            return self._send(
                200,
                {
                    "kind": "ConfigMapList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": "30"},
                    "items": [
                        {
                            "metadata": {
                                "name": f"cm-{ns}",
                                "namespace": ns,
                                "resourceVersion": "29",
                            },
                            "data": {"ds.json": ns},
                        }
                    ],
                },
            )
        if url.path == "/api/v1/configmaps" and not watching:
            return self._send(
                200,
                {
                    "kind": "ConfigMapList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": "20"},
                    "items": [
                        {
                            "metadata": {
                                "name": "m",
                                "namespace": "team-a",
                                "resourceVersion": "19",
                            },
                            "data": {"config.json": "{}"},
                        }
                    ],
                },
            )
        events = []
        if url.path == "/api/v1/nodes" and q.get("resourceVersion") == ["10"]:
            added, gone = (
                _node("h200-1", "NVIDIA-H200", 143771, "11"),
                _node("h800-1", "NVIDIA-H800", 81559, "12"),
            )
            events = [
                *(
                    {"type": "ADDED", "object": {"kind": "Node", **n}}
                    for n in _selected([added], q)
                ),
                *(
                    {"type": "DELETED", "object": {"kind": "Node", **n}}
                    for n in _selected([gone], q)
                ),
            ]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        for e in events:
            self.wfile.write(json.dumps(e).encode() + b"\n")
            self.wfile.flush()
        time.sleep(0.3)
        self.close_connection = True


@pytest.fixture
def fake_apiserver():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_list_then_watch_feeds_the_cache(fake_apiserver):
    cfg = client.Configuration(host=f"http://127.0.0.1:{fake_apiserver.server_address[1]}")
    store = InMemoryCache(synced=False)
    watcher = KubeWatchCache(store, client.ApiClient(cfg), watch_timeout_s=1)
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            store.synced()
            and store.gpu_product("NVIDIA-H200")
            and store.gpu_product("NVIDIA-H800") is None
        ):
            time.sleep(0.05)
        assert store.synced() and watcher.synced()
        assert store.gpu_product("NVIDIA-H200").memory_mib == 143771
        assert store.gpu_product("NVIDIA-H800") is None  # deleted by the watch
        # AMD nodes come from their own label-selected watch, which leaves NVIDIA's alone
        assert store.gpu_product("AMD_Instinct_MI300X_OAM").memory_mib == 196592
        assert any("labelSelector=amd.com/gpu.product-name" in p for p in _Handler.seen)
        assert store.config_map("team-a", "m") == {"config.json": "{}"}
        assert any("labelSelector=nvidia.com/gpu.product" in p for p in _Handler.seen), (
            _Handler.seen
        )
        assert any("labelSelector=dssup.io/watch%3Dtrue" in p for p in _Handler.seen)
    finally:
        watcher.stop()


def test_configmaps_are_watched_per_opted_in_namespace(fake_apiserver):
    """Least privilege: with --configmap-namespaces the webhook lists and watches ConfigMaps
    only there (a namespaced Role suffices), never across the cluster."""
    cfg = client.Configuration(host=f"http://127.0.0.1:{fake_apiserver.server_address[1]}")
    store = InMemoryCache(synced=False)
    _Handler.seen.clear()
    watcher = KubeWatchCache(
        store, client.ApiClient(cfg), watch_timeout_s=1, config_map_namespaces=("team-a", "team-b")
    )
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not store.synced():
            time.sleep(0.05)
        assert store.synced()
        assert store.config_map("team-a", "cm-team-a") == {"ds.json": "team-a"}
        assert store.config_map("team-b", "cm-team-b") == {"ds.json": "team-b"}
        cm_paths = [p for p in _Handler.seen if "configmaps" in p]
        assert cm_paths and all(p.startswith("/api/v1/namespaces/team-") for p in cm_paths)
    finally:
        watcher.stop()


def test_webhook_serve_process(tmp_path):
    ca = make_ca()
    crt, key = make_leaf(ca, tmp_path)
    proc, port, health = serve_process(
        crt,
        key,
        drain="0.2",
        global_args=("--log-format", "json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(proc, health)
        c = ApiserverClient(port, ca.pem())
        out = c.admit(load("pytorchjob-dsv3-resize.yaml"))
        c.close()
        assert out.allowed and out.patches == 1
        c = ApiserverClient(port, ca.pem())
        denied = c.admit(load("job-deepspeed.yaml"))
        c.close()
        assert not denied.allowed
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(r["msg"].startswith("serving https") for r in lines)
    denial = next(r for r in lines if r.get("decision") == "denied")
    assert denial["code"] == "no-feasible-plan" and denial["kind"] == "Job" and denial["uid"]
