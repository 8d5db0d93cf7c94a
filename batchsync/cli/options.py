"""The command line's options: those of the library made from their declarations
(``library_options``), the command's own values parsed, and shown again (masked) in the line
that resumes a run."""

from __future__ import annotations

import math
import os
import re
import shlex
import types
import typing
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ..core.redact import MASK, Secrets
from ..jobs.flags import Flag


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that refuses nan and infinity too: nan fails every comparison, so a
    range lets it through, and 1e400 (or 400 digits) reads as infinity. A value that is no
    number at all is told the form it must have (``5s``: seconds take no unit)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            float(value)
        except (TypeError, ValueError):
            seconds = isinstance(param, click.Option) and param.metavar == "SECONDS"
            what = "seconds as a plain number" if seconds else "a plain number"
            self.fail(f"expected {what}, e.g. 5 or 2.5; got {value!r}", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class WholeNumberRange(click.IntRange):
    """click.IntRange that tells a value that is no whole number (``5x``, ``2.5``) the form
    it must have, where click says "is not a valid integer range"."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            int(value)
        except (TypeError, ValueError):
            self.fail(f"expected a whole number, e.g. 5 or 20; got {value!r}", param, ctx)
        return super().convert(value, param, ctx)


# The sections of --help, in the order users reach for them, each option by its long name:
# every option is in exactly one (tests/test_cli_words.py), in the order it is listed.
HELP_SECTIONS: dict[str, tuple[str, ...]] = {
    "Input": (
        "--url", "--method", "--body-template", "--row-as-body", "--id-field", "--input-format",
    ),
    "Output": ("--output", "--format", "--flatten", "--report", "--expect", "--max-bytes"),
    "Resume and retry": ("--resume", "--retry-failed", "--fresh"),
    "Limits": (
        "--concurrency", "--rate", "--per-host", "--timeout", "--budget", "--deadline",
        "--attempts", "--retry-statuses", "--retry-answers", "--cooldown", "--breaker",
        "--adaptive", "--quota-headers", "--token-rate", "--input-token-rate",
        "--output-token-rate", "--max-cost", "--prices",
    ),
    "Requests": (
        "--header", "--secret-header", "--secret-param", "--auth-command", "--auth-header",
        "--cookies", "--dedup", "--hedge-after", "--deny-private", "--paginate",
        "--cursor-param", "--max-pages", "--items",
    ),
    "TLS": ("--cacert", "--cert", "--key", "--insecure"),
    "LLM batch endpoints": (
        "--batch-api", "--poll", "--batch-rows", "--batch-bytes", "--batch-retries", "--lanes",
        "--live-latency", "--keep-files", "--cancel", "--live",
    ),
    "Scaling out": (
        "--processes", "--redis", "--namespace", "--lease-ttl", "--dask", "--partition-size",
        "--metrics-port",
    ),
    "Display": ("--progress", "--verbose", "--quiet", "--version", "--help"),
}  # fmt: skip


def long_name(option: click.Parameter) -> str:
    """The name an option goes by in --help's sections: its first --name."""
    return next(name for name in option.opts if name.startswith("--"))


FC = TypeVar("FC", bound=Callable[..., Any])
_ByName = Mapping[str, click.Option]


def library_options(model: type[BaseModel]) -> Callable[[FC], FC]:
    """The click options of every field of ``model`` that has a ``Flag``, in the model's
    order: names, help and parser from the flag; type, bounds and default from the field."""

    def add(command: FC) -> FC:
        for name, field in reversed(model.model_fields.items()):
            flag = next((m for m in field.metadata if isinstance(m, Flag)), None)
            if flag is not None:
                command = click.option(*flag.names, name, **_option_settings(field, flag))(command)
        return command

    return add


def _option_settings(field: FieldInfo, flag: Flag) -> dict[str, Any]:
    """click.option's keywords for a declared option."""
    union = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
    members = typing.get_args(field.annotation) if union else (field.annotation,)
    kinds = [k for k in members if k is not type(None)]
    several = any(typing.get_origin(k) in (tuple, dict) for k in kinds)
    said = {"metavar": flag.metavar, "show_default": flag.show_default}
    settings: dict[str, Any] = {"help": flag.help, "multiple": several}
    settings |= {name: value for name, value in said.items() if value is not None}
    if not several:
        settings["default"] = field.default if flag.typed_default is None else flag.typed_default
    return settings | _reading(kinds, field, flag)


def _reading(kinds: list[Any], field: FieldInfo, flag: Flag) -> dict[str, Any]:
    """How click reads the option: a flag (a bool), the flag's parser, or the field's type."""
    if kinds == [bool]:
        return {} if "/" in flag.name else {"is_flag": True}
    if flag.parse is not None:  # (text: click would read a number's default as its type)
        return {"callback": reading(flag.parse), "type": click.STRING}
    return {"type": _click_type(kinds, field.metadata)}


def _click_type(kinds: list[Any], metadata: list[Any]) -> click.ParamType[Any, Any] | None:
    """The click type checking the field's literals or int/float bounds; None (text) else."""
    choices = [c for k in kinds if typing.get_origin(k) is Literal for c in typing.get_args(k)]
    if choices:
        return click.Choice(choices)
    if len(kinds) != 1:
        return None
    kind, bounds = _bounded(kinds[0], metadata)
    if kind is int:
        return WholeNumberRange(min=bounds.get("ge"), max=bounds.get("le"))
    if kind is float:
        above = "gt" in bounds
        low = bounds["gt"] if above else bounds.get("ge")
        return FiniteFloatRange(min=low, min_open=above, max=bounds.get("le"))
    return None


def _bounded(kind: Any, metadata: list[Any]) -> tuple[Any, dict[str, Any]]:
    """A field's type and bounds (``ge``, ``gt``, ``le``), an ``Annotated`` one's in a union too."""
    constraints = list(metadata)
    if typing.get_origin(kind) is Annotated:
        kind, *inner = typing.get_args(kind)
        constraints += [c for info in inner for c in getattr(info, "metadata", [info])]
    names = ("ge", "gt", "le")
    return kind, {name: getattr(c, name) for c in constraints for name in names if hasattr(c, name)}


def reading(
    parse: Callable[[Any], object],
) -> Callable[[click.Context, click.Parameter, Any], object]:
    """A parser of flag text (jobs.flags) as a click callback: its ValueError is click's
    usage line."""

    def read(ctx: click.Context, param: click.Parameter, value: Any) -> object:
        try:
            return parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return read


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


def prefix_text(value: str | None) -> str | None:
    """-o as given, once it can name files: not empty or blank (``-results.jsonl``), no
    control character (a file name that breaks every line that shows it). One that ends in
    a folder (``out/``, ``.``) is that folder (see ``output_prefix``)."""
    if value is None:
        return None
    name = value.rpartition(os.sep)[2]
    if not value.strip() or (name and not name.strip()) or _controls(value):
        raise ValueError(
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


def metrics_port_text(value: str | None) -> str | None:
    """--metrics-port as given, once it reads as [HOST:]PORT (the server binds it later)."""
    if value is not None:
        split_address(value)
    return value


def dask_address_text(value: str | None) -> str | None:
    """--dask as given, once it reads as [SCHEME://]HOST:PORT: anything else would have the
    client start work (or wait) for an address that cannot be one."""
    if value is None:
        return value
    try:
        host, _ = split_address(value.rpartition("://")[2])
    except ValueError:
        host = ""
    if not host:
        raise ValueError(
            "expected [SCHEME://]HOST:PORT, e.g. tcp://scheduler:8786 (PORT 1 to 65535)"
        )
    return value


def redis_url_text(value: str | None) -> str | None:
    """--redis as given, once it reads as a Redis URL. The value is never shown: it may
    hold a password."""
    if value is None:
        return value
    try:
        scheme = urlsplit(value).scheme
    except ValueError:
        scheme = ""
    if scheme not in ("redis", "rediss", "unix") or _controls(value):
        raise ValueError(
            "expected a Redis URL: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://... "
            "or unix://PATH"
        )
    return value


def auth_command_text(value: str | None) -> str | None:
    """--auth-command as given, once it can be a command (not blank, no NUL). The value is
    never shown: it may hold a secret."""
    if value is not None and (not value.strip() or "\0" in value):
        raise ValueError("expected a command that prints the token (not blank, no NUL)")
    return value


class Resume(typing.NamedTuple):
    """The command line that continues a run, and a hint when it shows a header as ``***``."""

    line: str
    hint: str | None


class _FromEnvironment(str):
    """A -H value whose secret is an environment variable's, shown as ``"Name: $VARIABLE"``
    (in double quotes: the shell puts the secret back in when the line is run)."""

    __slots__ = ()

    def quoted(self) -> str:
        given, _, variable = self.rpartition("$")
        return '"' + re.sub(r'([\\"$`])', r"\\\1", given) + "${" + variable + '}"'


def resume_command(
    argv: Sequence[str], secrets: Secrets, params: Iterable[click.Parameter]
) -> Resume:
    """The command line that continues this run: ``argv`` read as click reads it (short flags
    run together, ``--name=value``), ``-H`` values masked (or named by the environment
    variable that holds them, ``_shown_header``) and every word masked by ``secrets`` (the
    Redis URL's password, secret query parameters) but its template fields (``--url
    '…?api_key={tok}'`` names no secret, and must stay to be run again)."""
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
    end = words.index("--") if "--" in words else len(words)
    shown = ["python", "-m", "batchsync", *words[:end], "--resume", *words[end:]]
    return Resume(" ".join(_shell_word(word, secrets) for word in shown), _header_hint(words))


def _shell_word(word: str, secrets: Secrets) -> str:
    """A word of the resume line as the shell reads it back, masked by ``secrets``."""
    if isinstance(word, _FromEnvironment):
        return word.quoted()
    return shlex.quote(secrets.template(word))


def _header_hint(words: Sequence[str]) -> str | None:
    """How to give a -H value the resume line shows as ``***`` without typing it again."""
    return _HEADER_HINT if any(word.endswith(f": {MASK}") for word in words) else None


_HEADER_HINT = (
    "(-H values are shown as ***: type them again; or give them from an environment variable, "
    'e.g. -H "Authorization: Bearer $TOKEN", and the line to resume names it instead)'
)
# An environment variable's name, as a shell expands it.
_VARIABLE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# The words before a credential that are no secret: the HTTP authentication schemes.
AUTH_SCHEMES = frozenset({"basic", "bearer", "digest", "token", "negotiate", "hoba", "mutual"})
# The shortest value taken for a secret's source (shorter ones hold no credential).
_SHORTEST_SECRET = 8


def _shown_header(value: str) -> str:
    """A -H value as the resume line shows it: ``Name: $VARIABLE`` when an environment
    variable holds its value (or the credential after its scheme, ``Bearer $TOKEN``), so that
    the line runs as it is; else ``Name: ***``."""
    name, _, content = value.partition(":")
    content = content.strip()
    scheme, _, credential = content.partition(" ")
    sources = [(content, "")]
    if scheme.lower() in AUTH_SCHEMES:  # (any other first word may be part of the secret)
        sources.append((credential.strip(), f"{scheme} "))
    for secret, before in sources:
        variable = _variable_holding(secret)
        if variable is not None:
            return _FromEnvironment(f"{name}: {before}${variable}")
    return f"{name}: {MASK}"


def _variable_holding(secret: str) -> str | None:
    """The first (by name) environment variable whose value is ``secret``, None if none."""
    if len(secret) < _SHORTEST_SECRET:
        return None
    names = (n for n, v in os.environ.items() if v == secret and _VARIABLE.fullmatch(n))
    return min(names, default=None)


def _options_by_name(params: Iterable[click.Parameter]) -> dict[str, click.Option]:
    """Every name an option is given by (-c, --concurrency, --no-progress) to that option."""
    return {
        name: param
        for param in params
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
    }


def _long_option_words(word: str, options: _ByName, rest: Iterator[str]) -> list[str]:
    """``--name=value`` or ``--name value`` (taking the next word from ``rest``), as shown."""
    name, equals, given = word.partition("=")
    option = options.get(name)
    value = given if equals else None
    if option is not None and _takes_value(option) and not equals:
        value = next(rest, "")
    return _shown_option(name, option, value)


def _short_option_words(word: str, options: _ByName, rest: Iterator[str]) -> list[str]:
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
    """Whether the option takes the next word (--retry-failed, --batch-api: only after =)."""
    return (
        not option.is_flag and not option.count and option.name not in ("retry_failed", "batch_api")
    )


def _shown_option(name: str, option: click.Option | None, value: str | None) -> list[str]:
    if option is not None and option.name in ("resume", "retry_failed", "fresh", "live"):
        return []  # (--resume goes on with the pass they started)
    if value is None:
        return [name]
    if option is not None and option.name == "headers":
        value = _shown_header(value)
    return [name, value]
