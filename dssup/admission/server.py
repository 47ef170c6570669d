"""Serve the webhook: uvicorn (uvloop + httptools) on a TLS port, health on a plain port.

Responses leave as one write each (``corked.py``): one TLS record per answer.

Both servers share one event loop with the certificate watcher. Shutdown drains: readiness
turns false first (``drain_s``, so Endpoints drop the pod before it stops accepting), then both
servers stop gracefully. ``start_background`` runs the same thing in a thread on loopback for
tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
import uvloop
from pydantic import BaseModel, ConfigDict, Field

from dssup.admission.adapter import Adapter
from dssup.admission.asgi import HealthApp, WebhookApp
from dssup.admission.cache import ClusterCache
from dssup.admission.corked import ReadLimits, protocol_class
from dssup.admission.tls import CertReloader

__all__ = ["Background", "ServeOptions", "WebhookServer", "start_background", "tune_gc"]

log = logging.getLogger(__name__)


class ServeOptions(BaseModel):
    """Network settings of ``dssup webhook serve``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    cert_file: str = Field(description="PEM certificate chain (tls.crt of the mounted Secret)")
    key_file: str = Field(description="PEM private key (tls.key)")
    host: str = Field("0.0.0.0", description="listen address of both ports")  # noqa: S104
    port: int = Field(9443, ge=1, le=65535, description="HTTPS port of /mutate /validate /warn")
    health_port: int = Field(
        8081, ge=1, le=65535, description="plain HTTP /healthz /readyz /metrics"
    )
    max_body_bytes: int = Field(
        8 << 20, ge=1024, description="largest request body (HTTP 413 past it)"
    )
    reload_interval_s: float = Field(
        1.0, gt=0, description="seconds between certificate file checks"
    )
    keep_alive_s: int = Field(
        90, ge=1, description="idle keep-alive seconds (apiserver reuses conns)"
    )
    drain_s: float = Field(3.0, ge=0, description="seconds not-ready before stopping on SIGTERM")
    header_timeout_s: float = Field(
        10.0, gt=0, description="seconds a request's headers may take from its first byte"
    )
    body_timeout_s: float = Field(
        10.0, gt=0, description="seconds a request's body may take after its headers"
    )
    max_header_bytes: int = Field(
        32 << 10, ge=1024, description="largest request line plus headers (431 past it)"
    )
    judge_deadline_s: float = Field(
        1.0,
        gt=0,
        description="seconds after which a large review (judged off the event loop) is "
        "allowed unjudged, with a warning; well under the webhook's timeoutSeconds (2)",
    )
    offload_bytes: int = Field(
        64 << 10, ge=0, description="bodies larger than this are judged on a worker thread"
    )
    tune_gc: bool = Field(
        True, description="gc.freeze() after start-up and a larger gen-0 threshold"
    )


def tune_gc(gen0_threshold: int = 50_000) -> None:
    """Move everything alive after start-up out of the collector's way and collect young
    objects less often: a review allocates thousands of short-lived objects and almost no
    cycles, and full collections over the imported modules were a quarter of a decision's CPU."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the caller owns signals)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class WebhookServer:
    def __init__(
        self, opts: ServeOptions, adapter: Adapter, cache: ClusterCache, metrics_text: object = None
    ) -> None:
        self.opts = opts
        self.adapter = adapter
        self.cache = cache
        self.reloader = CertReloader(opts.cert_file, opts.key_file)
        self._draining = False
        render = getattr(metrics_text, "render", None)
        limits = ReadLimits(opts.header_timeout_s, opts.body_timeout_s, opts.max_header_bytes)
        common: dict[str, Any] = {
            "lifespan": "off",
            "access_log": False,
            "log_config": None,
            "loop": "none",
            "http": protocol_class(limits),
            "server_header": False,
            "date_header": False,
            # requests in flight at shutdown get this long; idle connections are dropped at once
            "timeout_graceful_shutdown": 1,
        }
        self.app = WebhookApp(
            adapter,
            opts.max_body_bytes,
            offload_bytes=opts.offload_bytes,
            deadline_s=opts.judge_deadline_s,
        )
        self.main = _Server(
            uvicorn.Config(
                self.app,
                host=opts.host,
                port=opts.port,
                ssl_context_factory=lambda _cfg, _default: self.reloader.context,
                timeout_keep_alive=opts.keep_alive_s,
                **common,
            )
        )
        self.health = _Server(
            uvicorn.Config(
                HealthApp(self.ready, render), host=opts.host, port=opts.health_port, **common
            )
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    def ready(self) -> bool:
        return self.main.started and not self._draining and self.cache.synced()

    async def run(
        self, tls_sock: socket.socket | None = None, health_sock: socket.socket | None = None
    ) -> None:
        self._loop = asyncio.get_running_loop()
        if self.opts.tune_gc:
            tune_gc()
        # A large review judged on a worker thread holds the GIL in slices of the switch
        # interval; 1 ms (instead of 5) keeps small reviews on the loop answered promptly.
        sys.setswitchinterval(0.001)
        watcher = asyncio.create_task(self.reloader.watch(self.opts.reload_interval_s))
        try:
            await asyncio.gather(
                self.main.serve([tls_sock] if tls_sock else None),
                self.health.serve([health_sock] if health_sock else None),
            )
        finally:
            watcher.cancel()
            self.app.close()

    async def _drain(self) -> None:
        self._draining = True
        await asyncio.sleep(self.opts.drain_s)
        self.main.should_exit = True
        self.health.should_exit = True

    def request_stop(self) -> None:
        """Thread- and signal-safe: start draining, then stop."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(lambda: loop.create_task(self._drain()))


@dataclass
class Background:
    """A server running in a thread on loopback; ``stop`` joins it."""

    server: WebhookServer
    thread: threading.Thread
    port: int
    health_port: int

    def stop(self, timeout: float = 10.0) -> None:
        self.server.request_stop()
        self.thread.join(timeout)


def _bind(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.set_inheritable(True)
    return sock


def start_background(
    opts: ServeOptions,
    adapter: Adapter,
    cache: ClusterCache,
    metrics_text: object = None,
    timeout: float = 10.0,
) -> Background:
    """Start on 127.0.0.1 with kernel-chosen ports; returns once both ports accept."""
    # No GC tuning in a host process (tests, benchmarks): it is process-wide.
    server = WebhookServer(
        opts.model_copy(update={"drain_s": 0.0, "tune_gc": False}), adapter, cache, metrics_text
    )
    tls_sock, health_sock = _bind("127.0.0.1"), _bind("127.0.0.1")
    thread = threading.Thread(
        target=lambda: uvloop.run(server.run(tls_sock, health_sock)),
        name="dssup-webhook",
        daemon=True,
    )
    thread.start()
    waited = 0.0
    while not (server.main.started and server.health.started):
        if waited > timeout or not thread.is_alive():
            raise RuntimeError("webhook server did not start")
        threading.Event().wait(0.01)
        waited += 0.01
    return Background(server, thread, tls_sock.getsockname()[1], health_sock.getsockname()[1])
