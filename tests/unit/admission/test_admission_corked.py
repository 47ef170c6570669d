"""``CorkedTransport`` over a real loopback TCP connection (uvloop, as the server runs it).

What must hold: writes made in one loop iteration reach the peer as one write and in order;
``close`` delivers what is pending; ``abort`` drops it. (Pipelined requests through the whole
server: tests/integration/admission/test_admission_tls.py.)
"""

import asyncio
import socket

import uvloop

from dssup.admission.corked import CorkedTransport


class _Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


async def _pair() -> tuple[CorkedTransport, asyncio.Transport, _Sink]:
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    sink = _Sink()
    inner, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
    peer, _ = await loop.connect_accepted_socket(lambda: sink, b)
    return CorkedTransport(inner, loop), peer, sink  # type: ignore[arg-type]


async def _settle(sink: _Sink, size: int) -> None:
    for _ in range(200):
        if sum(map(len, sink.chunks)) >= size:
            return
        await asyncio.sleep(0.005)


def test_writes_in_one_iteration_leave_as_one_write() -> None:
    async def main() -> None:
        corked, peer, sink = await _pair()
        corked.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
        corked.write(b"body")
        assert sink.chunks == [] and corked.get_write_buffer_size() == 42
        await _settle(sink, 42)
        assert sink.chunks == [b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbody"]
        corked.write(b"tail")
        corked.close()  # flushes what is pending before closing
        await asyncio.wait_for(sink.closed.wait(), 5)
        assert b"".join(sink.chunks).endswith(b"bodytail")
        peer.close()

    uvloop.run(main())


def test_abort_drops_pending_bytes() -> None:
    async def main() -> None:
        corked, peer, sink = await _pair()
        corked.write(b"never sent")
        corked.abort()
        await asyncio.wait_for(sink.closed.wait(), 5)
        assert sink.chunks == []
        assert corked.is_closing()
        peer.close()

    uvloop.run(main())


def test_uvicorn_internals_that_corked_relies_on_are_as_tested():
    """corked.py subclasses uvicorn's private HttpToolsProtocol. pyproject.toml pins uvicorn to
    the minor version tested here; this fails when a uvicorn inside or outside that range
    changes what the subclass uses (the attributes, callbacks and their call order below)."""
    import inspect
    import re
    import tomllib
    from pathlib import Path

    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("uvicorn"))
    low, high = re.search(r">=([\d.]+),<([\d.]+)", pin).groups()
    version = tuple(int(x) for x in uvicorn.__version__.split(".")[:2])
    assert tuple(map(int, low.split("."))) <= version < tuple(map(int, high.split("."))), pin
    for name in (
        "connection_made",
        "connection_lost",
        "data_received",
        "on_message_begin",
        "on_url",
        "on_header",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
        "shutdown",
        "timeout_keep_alive_handler",
    ):
        assert callable(getattr(HttpToolsProtocol, name)), name
    source = inspect.getsource(HttpToolsProtocol)
    for needle in (
        "self.transport = transport",  # connection_made keeps the transport it is given
        "self.timeout_keep_alive_task",  # the idle timer dssup also arms at connection_made
        "self._unset_keepalive_if_required()",  # data_received cancels it
        "self.cycle.response_complete",  # what shutdown reads to tell idle from busy
        "self.cycle.keep_alive = False",
        "def on_header(self, name: bytes, value: bytes)",
    ):
        assert needle in source, needle
    assert "self.parser.feed_data(data)" in inspect.getsource(HttpToolsProtocol.data_received)
