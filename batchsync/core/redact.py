"""Keeping secrets out of every text that leaves the process.

A run's ``Secrets`` know what is secret: header names (Authorization, Cookie and
Proxy-Authorization always, every ``-H`` header, declared names), query parameter names
(``api_key``, ``token``, … and declared ones), URL userinfo, and values known up front (the
``-H`` values, the Redis URL's password). Texts are masked by shape (``user:pass@``,
``?api_key=…``), which needs no list of values, and by value, in the forms an error message
or a log record may hold one: raw, escaped (``repr``, JSON, percent-encoding, base64), the
credential without its scheme (``Bearer …``), and cut short (``…`` or ``...`` at a cut). A
short value is masked by value only as a word of its own outside a path, so that masking
never corrupts the text around it (see _MIN_ANYWHERE).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit

from .kept import Kept

# Headers whose values are secrets wherever they come from.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
# Query parameters whose values are secrets (case-insensitive), as many APIs take their keys.
SECRET_PARAMS = frozenset({"api_key", "apikey", "key", "access_token", "token", "auth",
                           "signature", "sig", "password", "secret", "client_secret"})  # fmt: skip

MASK = "***"

# A piece of a secret shorter than this is not looked for on its own (it would mask words),
# nor a whole value shorter than _MIN_VALUE (a user name "u" would mask every "u"): those are
# masked by their shape only.
_MIN_PIECE = 6
_MIN_VALUE = 4
# A value (or piece) this long is masked wherever it stands: it does not turn up by chance in
# other text. A shorter one (a user name, a short password) can be a word or a path segment
# too, so it is masked only as a word of its own outside a path: "user" is masked in
# "user: bad" and "Basic user", never in "/basic-auth/user" or "/useronly".
_MIN_ANYWHERE = 8
# Where a short value may stand: after no letter, digit, "_" or "/" (a path segment), or
# right after a percent-escape (a value escaped into a URL); before no letter, digit or "_".
_WORD_START = r"(?:(?<![\w/])|(?<=%[0-9A-Fa-f]{2}))"
_WORD_END = r"(?!\w)"
# Userinfo: what stands between a scheme's "//" and the last "@" before the authority ends
# (as urllib3 splits it: a password may hold an "@"; masking too much is harmless).
_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.\-]*:)?//[^/?#\s]*@")
# The same in a URL percent-encoded into another one (?base=http%3A%2F%2Fuser%3Apass%40host):
# up to the last %40 before its authority ends (at %2F, %3F, %23 or the outer URL's own).
_ESCAPED_USERINFO = re.compile(r"(?i)(%2F%2F)(?:(?!%2F|%3F|%23)[^/?#&;\s'\"<>])*(%40)")
# name=value after ? & ; or # (a URL, a fragment, or a URL inside a message).
# Two readings of a value: up to a "?" (a URL given inside one: ?to=http://o/x?api_key=…),
# and past it (a value may hold a "?"); both are masked.
_PARAMS = (
    re.compile(r"(?<=[?&;#])([^=&;#?\s'\"<>]+)=([^&;#?\s'\"<>]*)"),
    re.compile(r"(?<=[?&;#])([^=&;#?\s'\"<>]+)=([^&;#\s'\"<>]*)"),
)
_CUTS = ("…", "...")
_NONE: frozenset[str] = frozenset()
# A value made of template fields only ({name}; {{ is a literal brace, no field).
_FIELDS_ONLY = re.compile(r"(?:\{[^{}]+\})+")


def _param_name(name: str) -> str:
    """A parameter's name as a server reads it: percent-decoded (``api%5Fkey``), without the
    spaces ``+`` stands for and the ``[]`` of PHP-style arrays, in lower case."""
    return unquote_plus(name).strip().removesuffix("[]").strip().lower()


def _forms(value: str) -> Iterator[str]:
    """The ways a text may hold ``value``: as is and escaped."""
    yield value
    yield json.dumps(value)[1:-1]
    yield json.dumps(value, ensure_ascii=False)[1:-1]
    yield repr(value)[1:-1]
    yield repr(value.encode("utf-8", "backslashreplace"))[2:-1]
    yield quote(value, safe="")
    yield quote(value)
    yield quote_plus(value)
    yield base64.b64encode(value.encode("utf-8", "backslashreplace")).decode()


def pieces(value: str) -> set[str]:
    """``value`` and its parts worth looking for alone: the credential after a scheme
    (``Bearer abc…``, the scheme itself left alone), the password after a user name, a
    cookie's value after its name."""
    parts = re.split(r"[\s:=,;]+", value)
    if len(parts) > 1 and re.match(r"[A-Za-z-]+\s", value):  # an auth scheme first
        parts = parts[1:]
    return {value, *(part for part in parts if len(part) >= _MIN_PIECE)}


@dataclass(slots=True)
class _Learned:
    """Secrets met while a run goes (tokens from ``auth=``), replaced whole on each change so
    that readers need no lock."""

    names: frozenset[str] = frozenset()
    values: frozenset[str] = frozenset()


# Learning is rare (a token an hour): one lock for every run is plenty, and keeps Secrets
# picklable.
_LEARN_LOCK = threading.Lock()
# Patterns kept per Secrets at most; past that the cache starts afresh (each new token makes
# the run's set of values a new one).
_MAX_PATTERNS = 16


@dataclass(frozen=True)
class Secrets:
    """What a run treats as secret, and the masking of texts by it."""

    names: frozenset[str] = SECRET_HEADERS
    params: frozenset[str] = SECRET_PARAMS
    values: frozenset[str] = frozenset()
    _patterns: Kept[frozenset[str], re.Pattern[str]] = field(
        default_factory=lambda: Kept(_MAX_PATTERNS), init=False, compare=False, repr=False
    )
    _learned: _Learned = field(default_factory=_Learned, init=False, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        batch_headers: Mapping[str, str] | None = None,
        declared: Iterable[str] = (),
        params: Iterable[str] = (),
        values: Iterable[str] = (),
    ) -> Secrets:
        headers = batch_headers or {}
        names = SECRET_HEADERS | {name.lower() for name in (*headers, *declared)}
        known = {value for value in (*headers.values(), *values) if len(value) >= _MIN_VALUE}
        return cls(names, SECRET_PARAMS | {p.lower() for p in params}, frozenset(known))

    def learn(self, values: Iterable[str], names: Iterable[str] = ()) -> None:
        """Treat ``values`` (and headers ``names``) as secret from now on: the tokens ``auth=``
        hands out while the run goes. Thread-safe; a value already known costs no lock."""
        learned = self._learned
        new_values = {v for v in values if len(v) >= _MIN_VALUE} - learned.values - self.values
        new_names = {n.lower() for n in names} - learned.names - self.names
        if not new_values and not new_names:
            return
        with _LEARN_LOCK:
            learned.values = learned.values | new_values
            learned.names = learned.names | new_names

    def is_secret(self, name: str) -> bool:
        name = name.lower()
        return name in self.names or name in self._learned.names

    def is_declared(self, name: str) -> bool:
        """A secret by the run's say-so (a batch header, a declared name, an ``auth=``
        header), which requests does not know to keep from other hosts."""
        return self.is_secret(name) and name.lower() not in SECRET_HEADERS

    def _mask_param(self, match: re.Match[str]) -> str:
        return f"{match[1]}={MASK}" if _param_name(match[1]) in self.params else match[0]

    def _param_values(self, text: str) -> set[str]:
        """The values of secret parameters in a text (one percent-decoded, say: a URL given as
        another URL's parameter)."""
        found = {
            m[2]
            for pattern in _PARAMS
            for m in pattern.finditer(text)
            if m[2] and _param_name(m[1]) in self.params
        }
        # (in a message the value may run into the punctuation after it: "…=v4lue: HTTP 404")
        return found | {value.rstrip(".,:)]}") for value in found}

    def text(self, text: str, extra: Iterable[str] = ()) -> str:
        """``text`` with every secret masked: by shape (userinfo, secret parameters), the
        run's known values and ``extra`` values (an item's own) in every form."""
        by_shape_only = not (extra or self.values or self._learned.values)
        if by_shape_only and "@" not in text and "=" not in text and "%" not in text:
            return text  # (no value to look for, no shape to mask: the fast lane's common case)
        return self._masked(text, extra, self._mask_param)

    # A URL is masked as any text: its userinfo and its secret query parameters' values by
    # shape, and known secret values in it too; whether it can be parsed or not.
    url = text

    def given(self, url: str, own: frozenset[str]) -> str:
        """An item's URL as given, masked: its secrets where they stand as secrets (userinfo,
        secret parameters, by shape), and the item's other secrets by value; the item's URL
        secrets that its path also holds are that path's text there (``admin:password@…/
        password-reset`` keeps ``/password-reset``)."""
        return self.text(url, self._outside(own, url))

    def _outside(self, own: frozenset[str], url: str) -> frozenset[str]:
        """``own`` less the secrets of ``url`` (or pieces of them) that its path holds too: text
        the caller wrote there, which the shape of ``url`` masks where it stands as a secret."""
        try:
            path = unquote(urlsplit(url).path)
        except ValueError:
            return own
        written = {piece for value in self._url_values(url) for piece in pieces(value)}
        context = {piece for piece in written if piece in path}
        return frozenset(value for value in own if not pieces(value) & context)

    def answered(self, url: str, own: frozenset[str], given: str) -> str:
        """Where an item's answer came from (its ``final_url``), masked as ``given`` masks the
        item's URL ``given``, and with every path segment that is one of the item's own short
        secrets masked too, unless ``given`` has it in its path: a server that copies a short
        key into a ``Location`` leaks it nowhere, and a path the caller wrote
        (``/basic-auth/user/passwd``) keeps its bytes."""
        if not own:
            return self.text(url)
        secret = self._outside(own, given)
        masked = self.text(url, secret)
        short = {value for value in secret if len(value) < _MIN_ANYWHERE}
        return _mask_segments(masked, short, given) if short else masked

    def template(self, text: str) -> str:
        """``text`` masked as a URL template is: a secret parameter whose value is template
        fields only (``api_key={tok}``) holds no secret and is kept, so that a command line
        shown with it runs again as given."""
        return self._masked(text, (), self._mask_param_but_fields)

    def _mask_param_but_fields(self, match: re.Match[str]) -> str:
        return match[0] if _FIELDS_ONLY.fullmatch(match[2]) else self._mask_param(match)

    def _masked(
        self, text: str, extra: Iterable[str], mask_param: Callable[[re.Match[str]], str]
    ) -> str:
        if "@" in text:
            text = _USERINFO.sub(lambda userinfo: f"{userinfo[1] or ''}//{MASK}@", text)
        if "=" in text:
            for pattern in _PARAMS:
                text = pattern.sub(mask_param, text)
        if "%" in text:  # a URL escaped inside another: its userinfo, its secrets found decoded
            text = _ESCAPED_USERINFO.sub(rf"\1{MASK}\2", text)
            extra = {*extra, *self._param_values(unquote_plus(text))}
        learned = self._learned.values  # (the values known now: given up front, and learned)
        known = self.values | learned if learned else self.values
        values = known.union(extra) if extra else known
        if not values:
            return text
        text = self._values_pattern(frozenset(values), known).sub(MASK, text)
        return _mask_cut(text, values)

    def _values_pattern(self, values: frozenset[str], known: frozenset[str]) -> re.Pattern[str]:
        pattern = self._patterns.get(values)
        if pattern is None:
            pattern = _values_regex({piece for value in values for piece in pieces(value)})
            if values == known:  # the run's own: kept; an item's: made each time
                self._patterns.keep(values, pattern)
        return pattern

    def of_item(
        self,
        urls: Iterable[str],
        headers: Mapping[str, Any] | None,
        params: Mapping[str, Any] | None,
    ) -> frozenset[str]:
        """An item's own secret values: its secret headers', its URLs' userinfo and secret
        query parameters', and its secret ``params``'."""
        found = self._of_headers(headers)
        found.update(*map(self._url_values, urls))
        params = params or {}
        found.update(str(v) for k, v in params.items() if str(k).lower() in self.params and v)
        return frozenset(value for value in found if len(value) >= _MIN_VALUE)

    def _of_headers(self, headers: Mapping[str, Any] | None) -> set[str]:
        """The values of the secret ``headers`` (those that are text)."""
        if not headers:
            return set()
        return {v for k, v in headers.items() if isinstance(v, str) and self.is_secret(str(k))}

    def of_url(self, url: str) -> frozenset[str]:
        """``of_item`` of a URL given alone: at no cost for one with no parameter, userinfo
        or escape (the fast lane's common case)."""
        if "=" not in url and "@" not in url and "%" not in url:
            return _NONE
        return self.of_item((url,), None, None)

    def _url_values(self, url: str) -> set[str]:
        if "=" not in url and "@" not in url and "%" not in url:
            return set()  # (no parameter, no userinfo)
        found = self._param_values(url) | self._param_values(unquote_plus(url))
        try:
            user, password = urlsplit(url).username, urlsplit(url).password
        except ValueError:  # unsplittable: masked by shape only
            return found
        for given in (user, password, f"{user}:{password}" if password is not None else None):
            if given:  # (user:password: what Basic auth sends, base64-encoded)
                found.update((given, unquote(given)))
        return found


def _mask_segments(masked: str, short: set[str], given: str) -> str:
    """``masked`` (a URL) with every path segment that is one of the ``short`` secrets masked,
    unless the path of ``given`` has it too."""
    try:
        parts, written = urlsplit(masked), urlsplit(given).path.split("/")
    except ValueError:
        return masked
    start = len(parts.scheme) + len(parts.netloc) + 3
    if masked[start : start + len(parts.path)] != parts.path or not parts.path:
        return masked
    hidden = short - {unquote(seg) for seg in written}
    path = "/".join(MASK if unquote(seg) in hidden else seg for seg in parts.path.split("/"))
    return masked[:start] + path + masked[start + len(parts.path) :]


def _values_regex(found: Iterable[str]) -> re.Pattern[str]:
    """One pattern for every form of the pieces ``found``: a long piece's forms wherever they
    stand, a short one's only as a word of their own outside a path (see _MIN_ANYWHERE)."""
    long = {form for piece in found if len(piece) >= _MIN_ANYWHERE for form in _forms(piece)}
    short = {form for piece in found if len(piece) < _MIN_ANYWHERE for form in _forms(piece)}
    alternatives = [_alternation(long)] if long else []
    if short:
        alternatives.append(f"{_WORD_START}(?:{_alternation(short)}){_WORD_END}")
    return re.compile("|".join(alternatives))


def _alternation(forms: Iterable[str]) -> str:
    """The forms as one alternation, longest first (a form that holds another wins)."""
    return "|".join(sorted((re.escape(form) for form in forms if form), key=len, reverse=True))


def _mask_cut(text: str, values: Iterable[str]) -> str:
    """Mask what is left of a secret where a message cut it short: a start of one before a
    ``…`` or ``...``, an end of one after it."""
    if not any(cut in text for cut in _CUTS):
        return text
    for form in _cut_forms(values):
        for cut in _CUTS:
            text = _mask_around(text, form, cut)
    return text


def _cut_forms(values: Iterable[str]) -> list[str]:
    """The forms of ``values``' long pieces that a cut leaves enough of to be known."""
    found = {piece for value in values for piece in pieces(value)}
    long = {piece for piece in found if len(piece) >= _MIN_ANYWHERE}
    return [form for piece in long for form in _forms(piece) if len(form) > _MIN_PIECE]


def _mask_around(text: str, form: str, cut: str) -> str:
    start = text.find(cut)
    while start >= 0:
        before = _overlap(text[:start], form, before=True)
        if before:
            text = text[: start - before] + MASK + text[start:]
            start += len(MASK) - before
        end = start + len(cut)
        after = _overlap(text[end:], form, before=False)
        if after:
            text = text[:end] + MASK + text[end + after :]
        start = text.find(cut, end)
    return text


def _overlap(text: str, form: str, *, before: bool) -> int:
    """The length (from _MIN_PIECE, short of all of it) of the longest start of ``form`` that
    ``text`` ends with (``before`` a cut), or of its longest end ``text`` starts with; or 0."""
    for k in range(len(form) - 1, _MIN_PIECE - 1, -1):
        if text.endswith(form[:k]) if before else text.startswith(form[-k:]):
            return k
    return 0


# The Secrets of the runs going on now, for the log filter.
_RUNS: list[Secrets] = []
_RUNS_LOCK = threading.Lock()


class RedactingFilter(logging.Filter):
    """Masks secrets in every record logged by batchsync and by urllib3 underneath it, with
    the Secrets of the runs going on (their masking by shape whatever the run), and escapes
    control characters: a server's text (a Link target, a status line) reaches no terminal
    raw, and makes no line of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: the handler reports it, as without us
            return True
        masked = _printable(_masked(message))
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            trace = logging.Formatter().formatException(record.exc_info)
            record.exc_text = _printable(_masked(trace), keep="\n")
        return True


_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(text: str, keep: str = "") -> str:
    """``text`` with its control characters (but ``keep``) written as ``\\xNN`` escapes."""
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub(lambda m: m[0] if m[0] in keep else f"\\x{ord(m[0]):02x}", text)


def _masked(text: str) -> str:
    own = getattr(_ITEM, "values", ())
    with _RUNS_LOCK:
        runs = list(_RUNS) or [Secrets()]
    for secrets in runs:
        text = secrets.text(text, own)
    return text


# The secret values of the item this thread is working on, for the log filter.
_ITEM = threading.local()


@contextlib.contextmanager
def item_secrets(values: frozenset[str]) -> Iterator[None]:
    """For the block: log records made on this thread are masked by ``values`` too (what
    urllib3 logs of an answer can echo an item's own header)."""
    _ITEM.values = values
    try:
        yield
    finally:
        _ITEM.values = ()


_FILTER = RedactingFilter()
_LOGGERS = ("batchsync", "urllib3.connectionpool", "urllib3.connection", "urllib3.poolmanager",
            "urllib3.response", "urllib3.util.retry")  # fmt: skip


@contextlib.contextmanager
def watching(secrets: Secrets) -> Iterator[Secrets]:
    """For a run's duration: its Secrets are masked in log records (see RedactingFilter)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    with _RUNS_LOCK:
        _RUNS.append(secrets)
    try:
        yield secrets
    finally:
        with _RUNS_LOCK:
            _RUNS.remove(secrets)
