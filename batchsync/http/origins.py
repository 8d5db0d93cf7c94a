"""Where a URL goes, as one key: the host key that limits are counted under, and the origin
(scheme, host, port) that cookies belong to. Every lane, backend and jar uses these."""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


def host_key(scheme: str, host: str, port: int | None) -> str:
    """The key a host's limits are counted under: lower-case host, IPv6 in brackets, and the
    port when it is not the scheme's default. Every lane and backend uses this one."""
    host = host.lower()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    if port is None or port == DEFAULT_PORTS.get(scheme.lower()):
        return host
    return f"{host}:{port}"


def host_of(url: str) -> str:
    """``host_key`` of a URL ("" for one without a host)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return host_key(parts.scheme, parts.hostname or "", port)


def origin_of(url: str) -> str | None:
    """``scheme://`` and the ``host_key`` of a URL; None without a host or with a bad port."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    scheme = parts.scheme.lower()
    return f"{scheme}://{host_key(scheme, parts.hostname, port)}"
