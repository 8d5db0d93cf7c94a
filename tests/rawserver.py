"""A raw-socket HTTP/1.1 server for tests that records every request byte for byte.

Built on ``socket`` and ``threading`` only (no ``http.server``, which would parse and
normalise what it reads), so that a test can compare exactly what two clients put on the wire:
the request line, the headers in their order and case, and the body.

What it answers, by the path of the request target (origin-form ``/path?query`` or, when it is
used as a forward proxy, absolute-form ``http://host:port/path?query``):

* ``/redirect?to=PATH``: ``302 Found`` with ``Location: PATH`` and a small body;
* ``/set-cookie?name=N&value=V``: ``200 OK`` with ``Set-Cookie: N=V; Path=/``;
* ``/cookie-gate?name=N&value=V``: ``503`` with that Set-Cookie until a request carries the
  cookie, then ``200``;
* ``/echo-auth``: a malformed status line that quotes the request's Authorization header (a
  hostile server: the client's error then holds the credential);
* ``/status/CODE``: that status without ``Location`` (a 204 or 304 without a body);
* ``/sized?bytes=N``: ``200 OK`` declaring a body of N bytes (built only when it is sent);
* a ``CONNECT`` (as a forward proxy asked for a tunnel): ``407 Proxy Authentication Required``;
* anything else: ``200 OK``, ``Content-Type: application/json``, body ``{"ok": true}``.

Every response carries Content-Length (a HEAD gets the header but no body). Connections are
kept alive for as many requests as the client sends. Request bodies are read by
Content-Length; chunked request bodies are not supported.
"""

from __future__ import annotations

import contextlib
import http
import socket
import ssl
import threading
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024
_IO_TIMEOUT = 10.0
_JSON_BODY = b'{"ok": true}'


def _header_value(head: bytes, name: bytes) -> bytes | None:
    """The value of the first header called ``name`` (any case) in a request head."""
    for line in head.split(b"\r\n")[1:]:
        field, sep, value = line.partition(b":")
        if sep and field.strip().lower() == name:
            return value.strip()
    return None


def _response(
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    send_body: bool,
    length: int | None = None,
) -> bytes:
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {len(body) if length is None else length}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if send_body else head


def answer(method: str, target: str, head: bytes = b"") -> bytes:
    """The full response to a request with this method and request target."""
    parts = urlsplit(target)  # absolute-form (proxy) targets too: only path and query count
    query = parse_qs(parts.query, keep_blank_values=True)
    send_body = method != "HEAD"
    if method == "CONNECT":
        return _response(407, [("Proxy-Authenticate", 'Basic realm="p"')], b"", send_body=False)
    if parts.path == "/redirect":
        location = query.get("to", ["/"])[0]
        return _response(
            302,
            [("Location", location), ("Content-Type", "text/plain")],
            b"redirecting",
            send_body=send_body,
        )
    if parts.path == "/echo-auth":
        return b"HTTP/1.1 abc " + (_header_value(head, b"authorization") or b"") + b"\r\n\r\n"
    headers = [("Content-Type", "application/json")]
    if parts.path.startswith("/status/"):
        status = int(parts.path.rpartition("/")[2])
        bodiless = status in (204, 304)
        body = b"" if bodiless else _JSON_BODY
        return _response(status, headers, body, send_body=send_body and not bodiless)
    if parts.path == "/sized":
        size = int(query.get("bytes", ["0"])[0])
        body = b"x" * size if send_body else b""
        return _response(200, headers, body, send_body=send_body, length=size)
    if parts.path == "/cookie-gate":  # 503 and the cookie, until the request carries it
        cookie = f"{query.get('name', ['n'])[0]}={query.get('value', ['v'])[0]}"
        if cookie.encode() not in (_header_value(head, b"cookie") or b""):
            headers.append(("Set-Cookie", f"{cookie}; Path=/"))
            return _response(503, headers, _JSON_BODY, send_body=send_body)
    if parts.path == "/set-cookie":
        name = query.get("name", ["n"])[0]
        value = query.get("value", ["v"])[0]
        headers.append(("Set-Cookie", f"{name}={value}; Path=/"))
    return _response(200, headers, _JSON_BODY, send_body=send_body)


class RawServer:
    """Listens on ``host`` (``127.0.0.1`` or ``::1``) on a free port, optionally over TLS.

    Use as a context manager; ``requests()`` gives the raw bytes (head and body) of every
    request received so far, in arrival order, and ``clear()`` forgets them.
    """

    def __init__(self, host: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None) -> None:
        self.host = host
        self._ssl_context = ssl_context
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, 0))
            self._listener.listen(64)
        except OSError:
            self._listener.close()
            raise
        # Polled, so that the accept loop sees the stop flag without a wake-up trick.
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._recorded: list[bytes] = []
        self._connections: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"rawserver-{self.port}", daemon=True
        )
        self._started = False

    @property
    def url(self) -> str:
        """``http(s)://host:port`` (an IPv6 host in brackets), without a trailing slash."""
        scheme = "https" if self._ssl_context is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def requests(self) -> list[bytes]:
        """The raw bytes of every request received, head and body, in arrival order."""
        with self._lock:
            return list(self._recorded)

    def clear(self) -> None:
        with self._lock:
            self._recorded.clear()

    def start(self) -> RawServer:
        if not self._started:
            self._started = True
            self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stop accepting, cut every open connection and wait (briefly) for the threads."""
        self._stop.set()
        if self._acceptor.is_alive():
            self._acceptor.join(timeout=5)
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
            threads = list(self._threads)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=5)
        for connection in connections:
            connection.close()

    def __enter__(self) -> RawServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.settimeout(_IO_TIMEOUT)
            thread = threading.Thread(
                target=self._serve, args=(connection,), name="rawserver-conn", daemon=True
            )
            with self._lock:
                if self._stop.is_set():
                    connection.close()
                    return
                self._connections.add(connection)
                self._threads.append(thread)
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        stream: socket.socket = connection
        try:
            if self._ssl_context is not None:
                # wrap_socket takes the connection's file descriptor over: track the wrapper.
                wrapped = self._ssl_context.wrap_socket(
                    connection, server_side=True, do_handshake_on_connect=False
                )
                stream = wrapped
                with self._lock:
                    self._connections.discard(connection)
                    self._connections.add(wrapped)
                wrapped.do_handshake()
            self._exchange(stream)
        except (OSError, ValueError):
            pass  # the client refused our certificate or went away, or stop() cut it off
        finally:
            with self._lock:
                self._connections.discard(stream)
                self._connections.discard(connection)
            stream.close()
            connection.close()

    def _exchange(self, stream: socket.socket) -> None:
        """Read requests off one connection and answer each, until either side closes."""
        buffer = b""
        while not self._stop.is_set():
            while _HEAD_END not in buffer:
                if len(buffer) > _MAX_HEAD:
                    stream.sendall(_response(400, [], b"", send_body=True))
                    return
                chunk = stream.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            end = buffer.index(_HEAD_END) + len(_HEAD_END)
            head, buffer = buffer[:end], buffer[end:]
            length_value = _header_value(head, b"content-length")
            length = int(length_value) if length_value and length_value.isdigit() else 0
            while len(buffer) < length:
                chunk = stream.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            body, buffer = buffer[:length], buffer[length:]
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, _, rest = request_line.partition(" ")
            target, _, version = rest.rpartition(" ")
            with self._lock:  # recorded before the answer goes out: the client sees it then
                self._recorded.append(head + body)
            stream.sendall(answer(method, target, head))
            connection_value = (_header_value(head, b"connection") or b"").lower()
            if connection_value == b"close" or (
                version == "HTTP/1.0" and connection_value != b"keep-alive"
            ):
                return
