"""The command line's own option values: parsing them, and showing them again (masked) in
the line that resumes a run."""

from __future__ import annotations

import math
import os
import shlex
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import click

from ..core.redact import MASK, Secrets
from ..http.retries import parse_statuses
from ..jobs.options import MAX_SETTING_SECONDS
from ..limits.breaker import Breaker
from ..limits.rates import parse_rate


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that refuses nan and infinity too: nan fails every comparison, so a
    range lets it through, and 1e400 (or 400 digits) reads as infinity."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


positive = FiniteFloatRange(min=0, min_open=True, max=MAX_SETTING_SECONDS)


class FilePath(click.Path):
    """click.Path that refuses a NUL in one usage line: ``os.stat`` would raise
    ValueError, a traceback."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and "\0" in value:
            self.fail("a path cannot hold a NUL character", param, ctx)
        return super().convert(value, param, ctx)


def _controls(text: str) -> bool:
    """Whether ``text`` holds a control character (NUL, a line break, ESC, ...)."""
    return any(unicodedata.category(c) == "Cc" for c in text)


def _header_name(name: str) -> bool:
    """Whether ``name`` can be a header's: ASCII, printable, no space or colon."""
    return (
        name != ""
        and name.isascii()
        and name.isprintable()
        and not any(c.isspace() or c == ":" for c in name)
    )


def parse_headers(
    ctx: click.Context, param: click.Parameter, values: Sequence[str]
) -> dict[str, str]:
    headers: dict[str, str] = {}
    for number, value in enumerate(values, start=1):
        name, colon, content = value.partition(":")
        if not colon or not _header_name(name.strip()):
            # Never echo the value: it is likely a secret.
            raise click.BadParameter(f"header {number} is not in the form 'Name: value'")
        headers[name.strip()] = content.strip()
    return headers


def parse_header_names(
    ctx: click.Context, param: click.Parameter, value: str | Sequence[str]
) -> str | Sequence[str]:
    """--auth-header and --secret-header: header names (ASCII, no space, colon or control
    character), checked before anything runs."""
    for name in [value] if isinstance(value, str) else value:
        if not _header_name(name):
            raise click.BadParameter(f"{name!r} is not a header name")
    return value


def parse_prefix(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """-o as given, once it can name files: not empty or blank (``-results.jsonl``), no
    control character (a file name that breaks every line that shows it). One that ends in
    a folder (``out/``, ``.``) is that folder (see ``output_prefix``)."""
    if value is None:
        return None
    name = value.rpartition(os.sep)[2]
    if not value.strip() or (name and not name.strip()) or _controls(value):
        raise click.BadParameter(
            "expected a prefix such as out/urls, or a folder such as out/ (not empty or "
            "blank, no control character)"
        )
    return value


def names_folder(prefix: str) -> bool:
    """Whether -o names a folder rather than a prefix: ``out/``, ``.``, ``..``."""
    return prefix.rpartition(os.sep)[2] in ("", ".", "..")


def split_address(value: str) -> tuple[str, int]:
    """``[HOST:]PORT`` (HOST may be ``[::1]``) as its host ('' when not given) and port:
    ValueError unless PORT is 1 to 65535 in digits (0 would take a port nobody is told of)
    and HOST has no space or control character."""
    host, _, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise ValueError("expected [HOST:]PORT, PORT a number from 1 to 65535")
    if _controls(host) or any(c.isspace() for c in host):
        raise ValueError("expected [HOST:]PORT, HOST without spaces or control characters")
    return host, int(port)


def parse_metrics_port(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--metrics-port as given, once it reads as [HOST:]PORT (the server binds it later)."""
    if value is not None:
        try:
            split_address(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def parse_dask_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--dask as given, once it reads as [SCHEME://]HOST:PORT: anything else would have the
    client start work (or wait) for an address that cannot be one."""
    if value is None:
        return value
    try:
        host, _ = split_address(value.rpartition("://")[2])
    except ValueError:
        host = ""
    if not host:
        raise click.BadParameter(
            "expected [SCHEME://]HOST:PORT, e.g. tcp://scheduler:8786 (PORT 1 to 65535)"
        )
    return value


def parse_redis_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--redis as given, once it reads as a Redis URL. The value is never shown: it may
    hold a password."""
    if value is None:
        return value
    try:
        scheme = urlsplit(value).scheme
    except ValueError:
        scheme = ""
    if scheme not in ("redis", "rediss", "unix") or _controls(value):
        raise click.BadParameter(
            "expected a Redis URL: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://... "
            "or unix://PATH"
        )
    return value


def parse_auth_command(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--auth-command as given, once it can be a command (not blank, no NUL). The value is
    never shown: it may hold a secret."""
    if value is not None and (not value.strip() or "\0" in value):
        raise click.BadParameter("expected a command that prints the token (not blank, no NUL)")
    return value


_BREAKER_FIELDS = (("ratio", float), ("window", int), ("min_calls", int), ("reset", float))
BREAKER_DEFAULT = ":".join(str(getattr(Breaker(), name)) for name, _ in _BREAKER_FIELDS)


def parse_breaker(ctx: click.Context, param: click.Parameter, value: str) -> Breaker | None:
    """``off``, ``on`` (the defaults) or RATIO[:WINDOW[:MIN_CALLS[:SECONDS]]], the fields
    left out taking their defaults."""
    if value == "off":
        return None
    parts = [] if value == "on" else value.split(":")
    try:
        if len(parts) > len(_BREAKER_FIELDS):
            raise ValueError(f"at most {len(_BREAKER_FIELDS)} fields")
        fields = zip(_BREAKER_FIELDS, parts, strict=False)
        return Breaker(**{name: kind(part) for (name, kind), part in fields})
    except ValueError as exc:
        raise click.BadParameter(
            f"expected RATIO[:WINDOW[:MIN_CALLS[:SECONDS]]], on or off ({exc})"
        ) from None


def parse_rate_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--rate and --token-rate as given, once they read as a rate (the library reads them
    again): N a second, or N/s, N/min, N/h; --rate auto too."""
    if value is None or (value == "auto" and param.name == "rate"):
        return value
    try:
        parse_rate(value, name=param.name or "rate")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def parse_retry_statuses(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--retry-statuses as given, once it names statuses (the library reads it again). Blank
    is refused: an unset shell variable would turn off every status's retries; ``none``
    says so."""
    if not value.strip():
        raise click.BadParameter("is empty: give the statuses, or none to retry no status")
    try:
        parse_statuses(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def parse_hedge_after(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> float | str | None:
    if value is None or value == "p95":
        return value
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_SETTING_SECONDS:
        raise click.BadParameter(
            f"expected a number of seconds above 0, or p95 (at most {MAX_SETTING_SECONDS} s)"
        )
    return seconds


def resume_command(argv: Sequence[str], secrets: Secrets, params: Iterable[click.Parameter]) -> str:
    """The command line that continues this run: ``argv`` read as click reads it (short flags
    run together, ``--name=value``), ``-H`` values masked and every word masked by
    ``secrets`` (the Redis URL's password, secret query parameters) but its template fields
    (``--url '…?api_key={tok}'`` names no secret, and must stay to be run again)."""
    options = _options_by_name(params)
    words: list[str] = []
    rest = iter(argv)
    for word in rest:
        if word == "--":  # everything after it is INPUT
            words.extend((word, *rest))
        elif not word.startswith("-") or word == "-":
            words.append(word)
        elif word.startswith("--"):
            words.extend(_long_option_words(word, options, rest))
        else:
            words.extend(_short_option_words(word, options, rest))
    words = [secrets.template(word) for word in words]
    end = words.index("--") if "--" in words else len(words)
    return shlex.join(["python", "-m", "batchsync", *words[:end], "--resume", *words[end:]])


def _options_by_name(params: Iterable[click.Parameter]) -> dict[str, click.Option]:
    """Every name an option is given by (-c, --concurrency, --no-progress) to that option."""
    return {
        name: param
        for param in params
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
    }


def _long_option_words(
    word: str, options: Mapping[str, click.Option], rest: Iterator[str]
) -> list[str]:
    """``--name=value`` or ``--name value`` (taking the next word from ``rest``), as shown."""
    name, equals, given = word.partition("=")
    option = options.get(name)
    value = given if equals else None
    if option is not None and _takes_value(option) and not equals:
        value = next(rest, "")
    return _shown_option(name, option, value)


def _short_option_words(
    word: str, options: Mapping[str, click.Option], rest: Iterator[str]
) -> list[str]:
    """Short options, maybe run together (-vH 'Name: value', -c8): the first one that takes
    a value takes the rest of the word, or the next word from ``rest``."""
    words: list[str] = []
    for position in range(1, len(word)):
        name = f"-{word[position]}"
        option = options.get(name)
        if option is not None and _takes_value(option):
            value = word[position + 1 :] or next(rest, "")
            words.extend(_shown_option(name, option, value))
            break
        words.extend(_shown_option(name, option, None))
    return words


def _takes_value(option: click.Option) -> bool:
    """Whether the option takes the next word as its value (--retry-failed takes its kinds
    only after an =)."""
    return not option.is_flag and not option.count and option.name != "retry_failed"


def _shown_option(name: str, option: click.Option | None, value: str | None) -> list[str]:
    if option is not None and option.name in ("resume", "retry_failed", "fresh"):
        return []  # (--resume goes on with the pass they started)
    if value is None:
        return [name]
    if option is not None and option.name == "headers":
        value = f"{value.partition(':')[0]}: {MASK}"
    return [name, value]
