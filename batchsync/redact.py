"""Keeping secrets out of logs, errors and output files."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of a secret value replaced by the mask."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


@dataclass(frozen=True)
class Secrets:
    """Which headers are secret: Authorization, Cookie and Proxy-Authorization always, plus
    every batch-wide header (``-H``) and any other name the caller declares."""

    names: frozenset[str] = SECRET_HEADERS
    batch_values: frozenset[str] = frozenset()

    @classmethod
    def of(cls, batch_headers: Mapping[str, str] | None, declared: Iterable[str] = ()) -> Secrets:
        headers = batch_headers or {}
        names = SECRET_HEADERS | {name.lower() for name in (*headers, *declared)}
        return cls(names, frozenset(value for value in headers.values() if value))

    def is_secret(self, name: str) -> bool:
        return name.lower() in self.names

    def is_declared(self, name: str) -> bool:
        """A secret by the run's say-so (a batch header, a declared name), which requests
        does not know to keep from other hosts."""
        name = name.lower()
        return name in self.names and name not in SECRET_HEADERS

    def values(self, item_headers: Mapping[str, str | None] | None = None) -> set[str]:
        """Every secret value in play: the batch's, and the item's secret headers'."""
        found = set(self.batch_values)
        found.update(v for k, v in (item_headers or {}).items() if v and self.is_secret(k))
        return found

    def public(self, headers: Mapping[str, str | None] | None) -> dict[str, str | None] | None:
        """The headers without the secret ones, for writing out."""
        kept = {k: v for k, v in (headers or {}).items() if not self.is_secret(k)}
        return kept or None
