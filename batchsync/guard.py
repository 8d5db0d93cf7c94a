"""The private-network guard (``deny_private=True``, ``--deny-private``).

For URL lists that someone else supplied: a host that resolves to a loopback, private,
link-local, multicast, unspecified or reserved address is refused. It is checked three times:
before the item is sent (after DNS resolution), on every redirect, and on the address each
connection actually reached (which defeats DNS rebinding between the check and the connect).
"""

from __future__ import annotations

import ipaddress
import socket
import threading


class PrivateAddress(Exception):  # not an OSError: nothing on the way wraps or retries it
    """The request would reach an address the guard refuses."""


def denied(address: str) -> bool:
    """Whether an IP address is one the guard refuses."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
    )


def resolve(host: str) -> list[str]:
    """The addresses a host name resolves to (an IP literal resolves to itself)."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class Guard:
    """Checks hosts once each (answers are kept per host for the run)."""

    def __init__(self) -> None:
        self._verdicts: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def check(self, host: str) -> None:
        """Raise PrivateAddress when ``host`` resolves to a refused address.

        A host that does not resolve is let through: the request then fails as usual.
        """
        host = host.strip("[]").lower()
        with self._lock:
            known = host in self._verdicts
            refused = self._verdicts.get(host)
        if not known:
            try:
                refused = next((a for a in resolve(host) if denied(a)), None)
            except OSError:
                refused = None
            with self._lock:
                self._verdicts[host] = refused
        if refused is not None:
            raise PrivateAddress(
                f"{host} resolves to {refused}, a private or local address (deny_private)"
            )

    @staticmethod
    def check_peer(sock: socket.socket) -> None:
        """Raise PrivateAddress when a connected socket reached a refused address."""
        peer = sock.getpeername()[0]
        if denied(peer):
            raise PrivateAddress(f"connected to {peer}, a private or local address (deny_private)")
