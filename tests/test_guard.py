"""The private-network guard: which addresses it refuses, and that it refuses them in time."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from batchsync import fetch_all
from batchsync.http.guard import Guard, PrivateAddress, denied


def teredo(server: str, client: str, port: int = 40000, flags: int = 0x8000) -> str:
    """The Teredo address of ``client`` (behind its NAT at ``port``) served by ``server``:
    2001:0:<server>:<flags>:<port ^ ffff>:<client ^ ffffffff> (RFC 4380)."""
    value = (
        0x2001_0000 << 96
        | int(ipaddress.IPv4Address(server)) << 64
        | flags << 48
        | (port ^ 0xFFFF) << 32
        | int(ipaddress.IPv4Address(client)) ^ 0xFFFF_FFFF
    )
    address = ipaddress.IPv6Address(value)
    assert address.teredo == (ipaddress.IPv4Address(server), ipaddress.IPv4Address(client))
    return str(address)


PUBLIC_SERVER = "65.54.227.120"  # a public Teredo server
PUBLIC_CLIENT = "93.184.216.34"

REFUSED = [
    # IPv4: loopback, private, link-local (the cloud metadata service), shared address space
    # (CGNAT, and Alibaba's metadata service), unspecified, broadcast, multicast, documentation,
    # benchmarking, reserved, IETF protocol assignments.
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
    "100.100.100.200", "0.0.0.0", "255.255.255.255", "224.0.0.1", "192.0.2.1", "198.18.0.1",
    "240.0.0.1", "192.0.0.8",
    # IPv6: loopback, unspecified, link-local (with and without a zone), unique local,
    # site-local, multicast, documentation (2001:db8::/32, and 3fff::/20 of RFC 9637, which
    # Python 3.11's ipaddress calls global), unallocated, IETF protocol assignments (ORCHIDv2,
    # AS112: global on some Python versions only).
    "::1", "::", "fe80::1", "fe80::1%eth0", "fc00::1", "fd12::1", "fec0::1", "ff02::1",
    "2001:db8::1", "3fff::1", "3fff:fff:ffff::1", "4000::1", "2001:20::1", "2001:4:112::1",
    # IPv4-mapped and (deprecated, never a real peer: refused whatever they carry)
    # IPv4-compatible addresses.
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:100.100.100.200", "::127.0.0.1", "::8.8.8.8",
    # 6to4 of 127.0.0.1, 10.0.0.1, 192.168.1.1.
    "2002:7f00:1::1", "2002:0a00:0001::1", "2002:c0a8:0101::1",
    # Teredo: a private client, a private server, a loopback client.
    teredo(PUBLIC_SERVER, "192.168.1.2"), teredo("10.0.0.1", PUBLIC_CLIENT),
    teredo(PUBLIC_SERVER, "127.0.0.1"),
    # NAT64 (well-known prefix) of 127.0.0.1, 10.0.0.1, 169.254.169.254; and the local-use
    # NAT64 prefix, whatever it carries: where the IPv4 sits in it is each network's choice.
    "64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::808:808",
]  # fmt: skip

# An address that carries a public IPv4 leads to that public host (a NAT64 gateway translates
# 64:ff9b::808:808 to 8.8.8.8: on an IPv6-only network with DNS64 every IPv4-only site
# resolves so), hence passes like the IPv4 itself; Teredo needs both its server and client
# public.
ALLOWED = [
    "8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "2001:4860:4860::8888",
    "3fff:1000::1", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
    teredo(PUBLIC_SERVER, PUBLIC_CLIENT),
]  # fmt: skip


@pytest.mark.parametrize(
    ("address", "refused"),
    [(address, True) for address in REFUSED] + [(address, False) for address in ALLOWED],
)
def test_which_addresses_are_denied(address: str, refused: bool) -> None:
    assert denied(address) is refused


def test_a_host_that_resolves_to_a_refused_address_is_refused() -> None:
    with pytest.raises(PrivateAddress, match=r"127\.0\.0\.1 resolves to 127\.0\.0\.1"):
        Guard().check("127.0.0.1")


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


def test_a_zone_id_as_a_url_gives_it_is_unescaped_before_the_check() -> None:
    # urlsplit leaves the zone of http://[fe80::1%25lo]/ escaped; getaddrinfo would not know it.
    with pytest.raises(PrivateAddress, match="fe80::1"):
        Guard().check("[fe80::1%25lo]")


def test_a_socket_connected_to_a_refused_address_is_refused(listener: socket.socket) -> None:
    with (
        socket.create_connection(listener.getsockname(), timeout=5) as sock,
        pytest.raises(PrivateAddress, match=r"connected to 127\.0\.0\.1"),
    ):
        Guard.check_peer(sock)


class Recorder:
    """A TCP listener that accepts every connection and records whatever bytes arrive on it,
    until the client closes it (or stays silent for ``patience`` seconds)."""

    def __init__(self, listener: socket.socket, patience: float) -> None:
        self.listener = listener
        self.patience = patience
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.listener.getsockname()[1]}/x"

    def _run(self) -> None:
        self.listener.settimeout(0.1)
        while True:
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                if self._stop.is_set():  # and nothing waits to be accepted
                    return
                continue
            with connection:
                connection.settimeout(self.patience)
                data = b""
                try:
                    while chunk := connection.recv(65536):
                        data += chunk
                except OSError:
                    pass
                self.received.append(data)

    def stop(self) -> list[bytes]:
        """Every connection's bytes, once the connections made so far have been read."""
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()
        return self.received


@pytest.mark.integration
@pytest.mark.parametrize("session", [None, requests.Session], ids=["fast-lane", "requests"])
def test_an_https_peer_is_checked_before_the_tls_client_hello(
    listener: socket.socket, monkeypatch: pytest.MonkeyPatch, session: type | None
) -> None:
    # The name check passes (as after DNS rebinding): the connection's peer must still fail,
    # before a single byte reaches the server.
    monkeypatch.setattr(Guard, "check", lambda self, host: None)
    recorder = Recorder(listener, patience=5)
    own = session() if session is not None else None
    (result,) = fetch_all([recorder.url], deny_private=True, attempts=1, session=own)
    received = recorder.stop()
    assert len(received) == 1  # the connection was made ...
    assert received == [b""]  # ... and nothing was sent on it, not even a ClientHello
    assert (result.error_kind, result.attempts) == ("invalid_request", 1)
    assert "connected to 127.0.0.1" in (result.error or "")


@pytest.mark.integration
def test_without_the_guard_the_recorder_sees_the_client_hello(listener: socket.socket) -> None:
    """The control for the test above: the same request unguarded does send bytes."""
    recorder = Recorder(listener, patience=0.5)
    (result,) = fetch_all([recorder.url], attempts=1, timeout=5)
    received = recorder.stop()
    assert not result.ok
    assert received and received[0][:1] == b"\x16"  # a TLS handshake record


@pytest.mark.integration
def test_the_rfc_9637_documentation_prefix_is_refused_by_the_library_and_the_cli(
    tmp_path: Path,
) -> None:
    # Python 3.11's ipaddress calls 3fff::/20 global: the guard must refuse it all the same,
    # before a connection is tried (nothing answers there: a try ends `timeout` or `connection`).
    url = "http://[3fff::1]:9/x"
    (result,) = fetch_all([url], deny_private=True, attempts=1, timeout=2)
    assert (result.error_kind, result.attempts) == ("invalid_request", 0)
    assert "3fff::1, a private or local address" in (result.error or "")
    (tmp_path / "urls.txt").write_text(url + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "urls.txt", "--deny-private", "--timeout", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = (tmp_path / "urls-results.jsonl").read_text().splitlines()
    assert json.loads(line)["error_kind"] == "invalid_request"
