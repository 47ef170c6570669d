"""Two bare ASGI applications: the webhook (TLS port) and health/metrics (plain HTTP port).

No framework on the hot path: the webhook reads the raw body (bounded by ``max_body_bytes``,
answering 413 past it), checks method (405), path (404) and content type (415), and hands the
bytes to the ``Adapter``. A review is judged on the event loop when its body is small (the
common case: microseconds); a body over ``offload_bytes`` is judged on a worker thread so that
other connections keep being answered, and an answer not ready ``deadline_s`` after it arrived
is an allowed one with a warning (fail open, well inside the apiserver's 2 s timeout). Health answers ``/healthz`` (the process serves), ``/readyz`` (caches
synced, certificate loaded, not draining) and ``/metrics`` (Prometheus text format).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dssup.admission.adapter import Adapter
from dssup.admission.policy import Mode
from dssup.admission.wire import AdmissionRequest

__all__ = ["HealthApp", "WebhookApp"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ROUTES: dict[str, Mode] = {"/mutate": "mutate", "/validate": "validate", "/warn": "warn"}
_JSON = [(b"content-type", b"application/json")]


async def _reply(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    hdrs = [*(headers or _JSON), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class WebhookApp:
    """``POST /mutate``, ``POST /validate`` (enforcing) and ``POST /warn`` (warnings only)."""

    def __init__(
        self,
        adapter: Adapter,
        max_body_bytes: int = 8 << 20,
        *,
        offload_bytes: int = 64 << 10,
        deadline_s: float = 1.0,
    ) -> None:
        self.adapter = adapter
        self.max_body_bytes = max_body_bytes
        self.offload_bytes = offload_bytes
        self.deadline_s = deadline_s
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dssup-judge")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _judge_off_loop(self, mode: Mode, body: bytes) -> tuple[int, bytes]:
        parsed: list[AdmissionRequest] = []
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, self.adapter.handle, mode, body, parsed)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.deadline_s)
        except TimeoutError:
            if not parsed:  # still reading the JSON: the answer needs its uid
                return await future
            return 200, self.adapter.fail_open(parsed[0], mode, self.deadline_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return None
        mode = ROUTES.get(scope["path"])
        if mode is None:
            return await _reply(
                send, 404, _error(f"no such path {scope['path']}; use {', '.join(ROUTES)}")
            )
        if scope["method"] != "POST":
            return await _reply(send, 405, _error("use POST"), [*_JSON, (b"allow", b"POST")])
        headers = dict(scope["headers"])
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if ctype != b"application/json":
            return await _reply(send, 415, _error("content type must be application/json"))
        length = headers.get(b"content-length")
        if (
            length is not None
            and length.isascii()
            and length.isdigit()
            and int(length) > self.max_body_bytes
        ):
            return await _reply(send, 413, _error(f"body over {self.max_body_bytes} bytes"))
        body = await self._body(receive)
        if body is None:
            return await _reply(send, 413, _error(f"body over {self.max_body_bytes} bytes"))
        if len(body) > self.offload_bytes:
            status, out = await self._judge_off_loop(mode, body)
        else:
            status, out = self.adapter.handle(mode, body)
        await _reply(send, status, out)
        # After the write is flushed (``corked.py`` flushes with call_soon, which runs first):
        # freeing what the review left behind is then in no request's latency.
        asyncio.get_running_loop().call_soon(self.adapter.tidy)
        return None

    async def _body(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return b""
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not msg.get("more_body"):
                return b"".join(chunks)


class HealthApp:
    """``/healthz``, ``/readyz`` and ``/metrics`` for probes and Prometheus."""

    def __init__(
        self, ready: Callable[[], bool], metrics: Callable[[], bytes] | None = None
    ) -> None:
        self.ready = ready
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return None
        text = [(b"content-type", b"text/plain; charset=utf-8")]
        path = scope["path"]
        if path == "/healthz":
            return await _reply(send, 200, b"ok\n", text)
        if path == "/readyz":
            ok = self.ready()
            return await _reply(
                send, 200 if ok else 503, b"ready\n" if ok else b"not ready\n", text
            )
        if path == "/metrics" and self.metrics is not None:
            prom = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
            return await _reply(send, 200, self.metrics(), prom)
        return await _reply(send, 404, b"not found\n", text)
