"""What differs between OpenAI's Batch API and Anthropic's Message Batches, as pure
functions: where each call goes, the caps, how a row is written, what a status means, and
what each line of the results says of its row.

Nothing here sends anything; ``client`` does, with these.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..core.verdict import ErrorKind
from ..http.origins import host_key
from ..store.submissions import ENDED, STATUSES, Part, Provider, well_formed

# ``--batch-api`` alone: the provider the URL's path names.
AUTO = "auto"

# The providers' caps for one submission: rows, and bytes (OpenAI: the uploaded file, 200 MB;
# Anthropic: the create request's body, 256 MB), in decimal units to stay under either reading.
CAPS: dict[Provider, tuple[int, int]] = {
    "openai": (50_000, 200_000_000),
    "anthropic": (100_000, 256_000_000),
}
# The OpenAI endpoints a batch may run (one per batch: the URL's path names it).
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses")

# A row's custom_id: its part's nonce and its input index (Anthropic allows 64 of
# [A-Za-z0-9_-]).
_CUSTOM_ID = re.compile(r"([0-9a-f]{12})-(0|[1-9][0-9]{0,17})")
# Anthropic's error types as the HTTP status a live call would have been answered with.
_ANTHROPIC_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


@dataclass(frozen=True)
class Endpoint:
    """Where a batch of rows for ``url`` goes: the provider, the base the batch calls hang
    from (OpenAI's ``…/v1``; Anthropic's ``…/v1/messages``) and the endpoint's path as
    OpenAI names it in each line (``/v1/chat/completions``)."""

    provider: Provider
    url: str
    base: str
    path: str

    def same_origin(self, url: str) -> bool:
        """Whether ``url`` goes where every call of the batch goes (and no other): the same
        scheme, host (any case, a trailing dot or not) and effective port, whatever userinfo
        either names; a URL that cannot be read goes nowhere."""
        mine = _origin(self.url)
        return mine is not None and mine == _origin(url)


def _origin(url: str) -> tuple[str, str] | None:
    """The scheme and ``host_key`` (its trailing dot dropped) of a URL, None when it has no
    host or cannot be read."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").rstrip(".")
    scheme = parts.scheme.lower()
    return (scheme, host_key(scheme, host, port)) if host else None


def endpoint_of(url: str, asked: str) -> Endpoint:
    """The batch endpoint for the live URL ``url``: the provider ``asked`` (``auto``: the
    one its path names). ValueError saying what is wrong."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if "{" in url:
        raise ValueError("--batch-api: the URL must be one endpoint, without {fields}")
    if parts.query or parts.fragment:
        raise ValueError("--batch-api: the URL must be the endpoint itself, without a query")
    provider = _provider_of(path) if asked == AUTO else asked
    if provider == "anthropic":
        if not path.endswith("/messages"):
            raise ValueError(
                "--batch-api=anthropic: the URL must be a Messages endpoint (…/v1/messages)"
            )
        base = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
        return Endpoint("anthropic", url, base, "/v1/messages")
    if provider != "openai":
        raise ValueError(f"--batch-api: {provider!r} is not one of openai, anthropic")
    head, marker, rest = path.rpartition("/v1/")
    endpoint = f"/v1/{rest}"
    if not marker or endpoint not in OPENAI_ENDPOINTS:
        raise ValueError(
            "--batch-api=openai: the URL must end in one of the endpoints a batch runs: "
            + ", ".join(OPENAI_ENDPOINTS)
        )
    base = urlunsplit((parts.scheme, parts.netloc, f"{head}/v1", "", ""))
    return Endpoint("openai", url, base, endpoint)


def _provider_of(path: str) -> Provider:
    if path.endswith("/v1/messages"):
        return "anthropic"
    if any(path.endswith(endpoint) for endpoint in OPENAI_ENDPOINTS):
        return "openai"
    raise ValueError(
        "--batch-api cannot tell the provider from the URL: it ends neither in /v1/messages "
        "(Anthropic) nor in an OpenAI endpoint; give --batch-api=openai or =anthropic"
    )


def custom_id(index: int, nonce: str) -> str:
    """The custom_id a row is submitted with: its part's nonce and its input index, nothing
    of the row."""
    return f"{nonce}-{index}"


def is_row_id(given: object) -> bool:
    """Whether ``given`` is a custom_id as batchsync writes them (of any part)."""
    return isinstance(given, str) and _CUSTOM_ID.fullmatch(given) is not None


def index_of(given: object, nonce: str) -> int | None:
    """The input index a results line's custom_id names, or None when it is not one of the
    part with ``nonce``."""
    if not isinstance(given, str):
        return None
    match = _CUSTOM_ID.fullmatch(given)
    return int(match.group(2)) if match and match.group(1) == nonce else None


def request_line(endpoint: Endpoint, index: int, body: Mapping[str, Any], nonce: str) -> bytes:
    """One row as the provider takes it: OpenAI's JSONL line, Anthropic's request object."""
    given = custom_id(index, nonce)
    if endpoint.provider == "openai":
        line = {"custom_id": given, "method": "POST", "url": endpoint.path, "body": body}
    else:
        line = {"custom_id": given, "params": body}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()


# Bytes around the rows of an Anthropic create body: '{"requests":[' and ']}', and a comma
# between rows; an OpenAI file has a newline after each line.
def submission_size(provider: Provider, lines: int, line_bytes: int) -> int:
    """The bytes a submission of ``lines`` rows (``line_bytes`` in all) takes."""
    if provider == "openai":
        return line_bytes + lines
    return line_bytes + max(lines - 1, 0) + len('{"requests":[]}')


# --- a batch's status ------------------------------------------------------------------------
def status_of(provider: Provider, batch: Mapping[str, Any]) -> str | None:
    """The batch's status as the provider says it, or None when it says none we know."""
    status = batch.get("status" if provider == "openai" else "processing_status")
    return status if isinstance(status, str) and status in STATUSES[provider] else None


def has_ended(status: str) -> bool:
    return status in ENDED


def belongs_to(provider: Provider, batch: Mapping[str, Any], part: Part) -> bool:
    """Whether the provider's ``batch`` can be the one made of ``part``: OpenAI's was made of
    its uploaded file; Anthropic's holds as many rows (it names nothing else of them)."""
    if provider == "openai":
        return part.input_file is not None and batch.get("input_file_id") == part.input_file
    counts = batch.get("request_counts")
    if not isinstance(counts, Mapping):
        return False
    total = sum(value for value in counts.values() if isinstance(value, int))
    return total == part.size


def created_at(provider: Provider, batch: Mapping[str, Any]) -> float | None:
    """When the provider made ``batch`` (unix seconds: OpenAI's number, Anthropic's RFC 3339
    time), or None when it does not say."""
    given = batch.get("created_at")
    if provider == "openai":
        return (
            float(given) if isinstance(given, int | float) and not isinstance(given, bool) else None
        )
    if not isinstance(given, str):
        return None
    try:
        return datetime.fromisoformat(given.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def refused_for_tokens(batch: Mapping[str, Any]) -> bool:
    """Whether an OpenAI batch failed because the organization's enqueued-token cap was
    reached: it never ran, and may be submitted again once others have finished."""
    return any(error.get("code") == "token_limit_exceeded" for error in batch_errors(batch))


def batch_errors(batch: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The errors an OpenAI batch that failed as a whole lists."""
    errors = batch.get("errors")
    data = errors.get("data") if isinstance(errors, Mapping) else None
    return [error for error in data or () if isinstance(error, Mapping)]


def failure_text(batch: Mapping[str, Any]) -> str:
    """One line saying why a batch failed as a whole (its first error)."""
    for error in batch_errors(batch):
        code, message = error.get("code"), error.get("message")
        return f"{code}: {message}" if code else str(message)
    return "the batch failed at the provider, giving no reason"


@dataclass(frozen=True)
class Files:
    """Where an ended batch's results are: OpenAI's output and error files, or Anthropic's
    results URL (None for each that it has not)."""

    output: str | None = None
    error: str | None = None
    results_url: str | None = None


def files_of(provider: Provider, batch: Mapping[str, Any]) -> Files:
    if provider == "openai":
        return Files(
            well_formed(provider, "file", batch.get("output_file_id")),
            well_formed(provider, "file", batch.get("error_file_id")),
        )
    url = batch.get("results_url")
    return Files(results_url=url if isinstance(url, str) else None)


# --- what a results line says of its row -------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """One row's outcome as its results line says it: the HTTP status and body a live call
    would have had, or the kind of failure that kept it from one."""

    index: int
    ok: bool
    status_code: int | None = None
    data: Any = None
    error_kind: ErrorKind | None = None
    error: str | None = None


def answer_of(provider: Provider, line: Any, nonce: str) -> Answer | None:
    """The Answer of one results line, or None when the line names no row of the part with
    ``nonce``."""
    if not isinstance(line, Mapping):
        return None
    index = index_of(line.get("custom_id"), nonce)
    if index is None:
        return None
    if provider == "openai":
        return _openai_answer(index, line)
    return _anthropic_answer(index, line.get("result"))


def _openai_answer(index: int, line: Mapping[str, Any]) -> Answer:
    response, error = line.get("response"), line.get("error")
    if isinstance(response, Mapping) and isinstance(response.get("status_code"), int):
        status, body = response["status_code"], response.get("body")
        if 200 <= status < 300:
            return Answer(index, True, status, body)
        return Answer(index, False, status, None, "status", f"HTTP {status}{_said(body)}")
    code = error.get("code") if isinstance(error, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else None
    kind: ErrorKind = "batch_errored"
    if code in ("batch_expired", "batch_cancelled"):
        kind = "batch_expired" if code == "batch_expired" else "batch_cancelled"
    said = f"{code}: {message}" if code else message or "the provider gave no result"
    return Answer(index, False, None, None, kind, _line(said))


def _anthropic_answer(index: int, result: Any) -> Answer:
    kind = result.get("type") if isinstance(result, Mapping) else None
    if kind == "succeeded":
        return Answer(index, True, 200, result.get("message"))
    if kind == "expired":
        return Answer(index, False, None, None, "batch_expired", "the batch expired before it ran")
    if kind == "canceled":
        return Answer(index, False, None, None, "batch_cancelled", "the batch was cancelled")
    error = result.get("error") if isinstance(result, Mapping) else None
    inner = error.get("error") if isinstance(error, Mapping) else None
    if isinstance(inner, Mapping):
        status = _ANTHROPIC_STATUS.get(str(inner.get("type")))
        text = _line(f"{inner.get('type')}: {inner.get('message')}")
        return Answer(index, False, status, None, "batch_errored", text)
    return Answer(index, False, None, None, "batch_errored", "the provider gave no result")


def _said(body: Any) -> str:
    """': message' when an error body says one (OpenAI's ``error.message``)."""
    error = body.get("error") if isinstance(body, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else None
    return f": {_line(message)}" if message else ""


def _line(text: object) -> str:
    """A provider's message as one line of at most 300 characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= 300 else flat[:299] + "…"


def usage_of(provider: Provider, data: Any) -> tuple[int, int]:
    """(input, output) tokens an answer's ``usage`` says it used; (0, 0) when it says none."""
    usage = data.get("usage") if isinstance(data, Mapping) else None
    if not isinstance(usage, Mapping):
        return 0, 0
    names = ("prompt_tokens", "completion_tokens")
    if provider == "anthropic":
        names = ("input_tokens", "output_tokens")
    counts = [usage.get(name) for name in names]
    return tuple(  # type: ignore[return-value]
        count
        if isinstance(count, int) and not isinstance(count, bool) and 0 <= count < _MOST
        else 0
        for count in counts
    )


# The most tokens one answer may say it used (a count past it is no count: read as none).
_MOST = 2**40
