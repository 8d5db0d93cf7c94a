"""Keeping secrets out of logs, errors and output files."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

# Headers whose values are secrets wherever they come from.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})

MASK = "***"


def redact_url(url: str) -> str:
    """The URL with the password of any ``user:pass@`` replaced by the mask."""
    if "@" not in url:
        return url
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    netloc = parts.netloc.replace(f":{password}@", f":{MASK}@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def secret_values(headers: Mapping[str, str] | None, all_secret: bool = False) -> set[str]:
    """The values among ``headers`` that must never be shown (every one when ``all_secret``)."""
    return {
        value
        for name, value in (headers or {}).items()
        if value and (all_secret or name.lower() in SECRET_HEADERS)
    }


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of a secret value replaced by the mask."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


def public_headers(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """The headers without the secret ones, for writing out."""
    if headers is None:
        return None
    kept = {name: value for name, value in headers.items() if name.lower() not in SECRET_HEADERS}
    return kept or None
