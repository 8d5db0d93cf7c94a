"""The private-network guard (``deny_private=True``, ``--deny-private``).

For URL lists that someone else supplied, whose requests must not reach this machine, its
networks or a cloud metadata service: only globally reachable unicast addresses pass, and an
IPv6 address that carries an IPv4 one is judged by that IPv4, where its packets may end up.
Hosts are checked before the item is sent (after DNS resolution), on every redirect, and on the
address each connection actually reached (which defeats DNS rebinding between the check and
the connect).
"""

from __future__ import annotations

import socket
import threading
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address
from urllib.parse import unquote


class PrivateAddress(Exception):  # not an OSError: nothing on the way wraps or retries it
    """The request would reach an address the guard refuses."""


# Not globally reachable, yet ``is_global`` on some Python versions: listed so that the answer
# is the same on all of them. (``is_reserved`` covers ::/8 on all of them: the deprecated
# IPv4-compatible ::a.b.c.d, and the local-use NAT64 64:ff9b:1::/48, where the IPv4 sits is
# each network's choice; and the unallocated IPv6 space.)
_NOT_GLOBAL = (
    IPv4Network("192.0.0.0/24"),  # IETF protocol assignments (before 3.12.4: only the /29)
    IPv6Network("2001::/23"),  # IETF protocol assignments (newer Pythons except a few); Teredo
    IPv6Network("fec0::/10"),  # site-local (deprecated)
    IPv6Network("3fff::/20"),  # documentation (RFC 9637): global to some Pythons, 3.11 too
)
_NAT64 = IPv6Network("64:ff9b::/96")  # the well-known prefix: the IPv4 is the last 32 bits


def _carried(ip: IPv6Address) -> tuple[IPv4Address, ...]:
    """The IPv4 addresses an IPv6 one carries: mapped, 6to4, Teredo (server and client), NAT64."""
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return ip.teredo
    if ip in _NAT64:
        return (IPv4Address(int(ip) & 0xFFFFFFFF),)
    return ()


def _refused(ip: IPv4Address | IPv6Address) -> bool:
    return (
        ip.is_multicast
        or ip.is_reserved
        or not ip.is_global
        or any(ip in network for network in _NOT_GLOBAL)
    )


def denied(address: str) -> bool:
    """Whether an IP address (a zone id allowed) is one the guard refuses."""
    ip = ip_address(address.split("%", 1)[0])
    carried = _carried(ip) if isinstance(ip, IPv6Address) else ()
    if carried:
        return any(_refused(inner) for inner in carried)
    return _refused(ip)


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
        host = unquote(host.strip("[]")).lower()  # (a zone id comes escaped: fe80::1%25lo)
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
