"""A lean asyncio HTTP/1.1 keep-alive server for benchmarks: every request answers
``{"ok":true}`` after ``--delay`` seconds; ``/stats`` reports requests and connections.

    python scripts/bench_server.py --delay 0.05      # prints "listening on http://127.0.0.1:PORT"

It uses uvloop when installed. It is the 50 ms server of ``make bench`` (and the fast one when
nginx is not available): waiting costs it nothing, so it holds hundreds of requests at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

BODY = b'{"ok":true}'
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY
)


class Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.connections = 0
        self.in_flight = 0
        self.peak = 0


class Handler(asyncio.Protocol):
    def __init__(self, stats: Stats, delay: float) -> None:
        self._stats = stats
        self._delay = delay
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._stats.connections += 1

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while b"\r\n\r\n" in self._buffer:
            head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
            target = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
            if target == b"/stats":
                self._stats_reply()
                continue
            stats = self._stats
            stats.requests += 1
            stats.in_flight += 1
            stats.peak = max(stats.peak, stats.in_flight)
            if self._delay:
                asyncio.get_running_loop().call_later(self._delay, self._answer)
            else:
                self._answer()

    def _answer(self) -> None:
        self._stats.in_flight -= 1
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(RESPONSE)

    def _stats_reply(self) -> None:
        stats = self._stats
        body = json.dumps(
            {"requests": stats.requests, "connections": stats.connections, "peak": stats.peak}
        ).encode()
        assert self._transport is not None
        self._transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )


async def serve(port: int, delay: float) -> None:
    stats = Stats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Handler(stats, delay), "127.0.0.1", port, backlog=1024, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.delay))


if __name__ == "__main__":
    main()
