"""The command line's own option values: parsing them, and showing them again (masked) in
the line that resumes a run."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence

import click

from ..limits import Breaker
from ..rates import parse_rate
from ..redact import MASK, Secrets
from ..retries import parse_statuses

positive = click.FloatRange(min=0, min_open=True)


def parse_headers(
    ctx: click.Context, param: click.Parameter, values: Sequence[str]
) -> dict[str, str]:
    headers: dict[str, str] = {}
    for number, value in enumerate(values, start=1):
        name, colon, content = value.partition(":")
        if not colon or not name.strip() or any(c.isspace() for c in name.strip()):
            # Never echo the value: it is likely a secret.
            raise click.BadParameter(f"header {number} is not in the form 'Name: value'")
        headers[name.strip()] = content.strip()
    return headers


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
    """--retry-statuses as given, once it names statuses (the library reads it again)."""
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
    if not seconds > 0:
        raise click.BadParameter("expected a number of seconds above 0, or p95")
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
