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
