"""What every provider's batch endpoint is to the rest of the lane: the ``BatchProvider``
interface (one module a provider implements it, ``providers`` lists them), and what the lane
says of any of them: the endpoint a run goes to, where an ended batch's results are, one row's
outcome, and each row's ``custom_id`` (its part's nonce and its input index).

Nothing here sends anything; ``client`` does, through the run's transport.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import SplitResult, urlsplit

from ..core.verdict import ErrorKind, Verdict, retry, terminal
from ..http.httpfacts import HttpFacts
from ..http.origins import host_key
from ..http.retries import RetryIf
from ..store.submissions import Part, Shape

# A row's custom_id: its part's nonce and its input index (64 of [A-Za-z0-9_-] at most, the
# tightest provider's rule).
_CUSTOM_ID = re.compile(r"([0-9a-f]{12})-(0|[1-9][0-9]{0,17})")


@dataclass(frozen=True)
class Endpoint:
    """Where a batch of rows for ``url`` goes: the provider's name, the base its batch calls
    hang from and the endpoint's path as the provider names it in each row."""

    provider: str
    url: str
    base: str
    path: str

    def same_origin(self, url: str) -> bool:
        """Whether ``url`` goes where every call of the batch goes: the same scheme, host (any
        case, a trailing dot or not) and port, whatever userinfo; an unreadable URL does not."""
        mine = _origin(self.url)
        return mine is not None and mine == _origin(url)


def _origin(url: str) -> tuple[str, str] | None:
    """The scheme and ``host_key`` of a URL (None: no host, or unreadable)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").rstrip(".")
    scheme = parts.scheme.lower()
    return (scheme, host_key(scheme, host, port)) if host else None


@dataclass(frozen=True)
class Files:
    """Where an ended batch's results are: its output and error files, or its results URL."""

    output: str | None = None
    error: str | None = None
    results_url: str | None = None


# A resumable upload's start: its headers, its body, and the answer's header naming where the
# bytes go.
Start = tuple[dict[str, str], bytes, str]


@dataclass(frozen=True)
class Answer:
    """One row's outcome as its results line says it: the status and body a live call would
    have had, or the kind of failure that kept it from one."""

    index: int
    ok: bool
    status_code: int | None = None
    data: Any = None
    error_kind: ErrorKind | None = None
    error: str | None = None


class BatchProvider(Protocol):
    """One provider's batch endpoint: its facts and the pure rules of its calls and answers.
    ``client`` makes the calls these describe; the ``sender`` asks these what each answer
    means. A new provider is a module implementing this and one line in ``providers``."""

    name: str
    # What the journal checks of its parts (statuses, ids, whether rows go up as a file).
    shape: Shape
    # The most rows and bytes one submission may hold.
    caps: tuple[int, int]
    # Whether its batch list names a batch's rows well enough to tell a part's batch by
    # ``belongs_to`` alone; else one is taken only once its results carry the part's nonce.
    identifies_rows: bool
    # The status of a batch that failed as a whole (none of its rows ran), if it has one.
    failed_status: str | None
    # The statuses in which a batch runs its rows (the others: waiting, or ending).
    working: frozenset[str]
    # The field by which each results line names its row (its custom_id), written first.
    row_key: str

    def endpoint(self, url: SplitResult) -> Endpoint | None:
        """The endpoint a live URL is a batch endpoint of (None: none of this provider's)."""

    def batches_url(self, endpoint: Endpoint) -> str:
        """Where its batches are listed."""

    def create_url(self, endpoint: Endpoint) -> str:
        """Where a batch is made."""

    def batch_url(self, endpoint: Endpoint, batch: str) -> str:
        """One batch: polled, and deleted when the provider keeps batches."""

    def cancel_url(self, endpoint: Endpoint, batch: str) -> str:
        """Where one batch is cancelled."""

    def batch_id(self, batch: Mapping[str, Any]) -> object:
        """The id of ``batch`` (one of its objects) as the provider names it."""

    def list_params(self, cursor: str | None) -> dict[str, Any]:
        """The query of a page of its list of batches: the first, or the one after ``cursor``."""

    def listed(self, answer: Any) -> tuple[list[Mapping[str, Any]], bool, str | None]:
        """A page of its list of batches: those on it (newest first), whether more follow, and
        the cursor of the next page (None: it gives none)."""

    def describe_endpoints(self) -> str:
        """What a URL it takes must do, for a refusal's message ("end in …", "be …")."""

    def upload_url(self, endpoint: Endpoint) -> str:
        """Where a file of rows is uploaded (a provider that uploads them)."""

    def upload_start(self, name: str, size: int) -> Start | None:
        """A resumable upload's start (its headers, its body and the answer's header naming
        where the bytes go); None: the file goes up as one form."""

    def upload_finish(self) -> dict[str, str]:
        """The headers of a resumable upload's call that sends the bytes and finishes it."""

    def file_id(self, file: Any) -> object:
        """The id of a file as an upload's answer, or a list of files, names it."""

    def file_label(self, file: Mapping[str, Any]) -> object:
        """The name a file was uploaded under."""

    def file_params(self, cursor: str | None) -> dict[str, Any]:
        """The query of a page of its list of batch files: the first, or the one after
        ``cursor``."""

    def files_listed(self, answer: Any) -> tuple[list[Mapping[str, Any]], bool, str | None]:
        """A page of its list of files: those on it, whether more follow, and the cursor of
        the next page (None: it gives none)."""

    def request_line(
        self, endpoint: Endpoint, index: int, body: Mapping[str, Any], nonce: str
    ) -> bytes:
        """One row as the provider takes it, with its ``custom_id``."""

    def submission_size(self, lines: int, line_bytes: int) -> int:
        """The bytes a submission of ``lines`` rows (``line_bytes`` in all) takes."""

    def create_body(
        self, endpoint: Endpoint, input_file: str | None, lines: Sequence[bytes], part: int
    ) -> bytes:
        """The create call's body: the uploaded file's id, or the rows themselves."""

    def status_of(self, batch: Mapping[str, Any]) -> str | None:
        """The batch's status as the provider says it, None when it says none it documents."""

    def created_at(self, batch: Mapping[str, Any]) -> float | None:
        """When the provider made ``batch`` (unix seconds in its own clock)."""

    def belongs_to(self, batch: Mapping[str, Any], part: Part) -> bool:
        """Whether ``batch`` can be the one made of ``part``."""

    def files_of(self, batch: Mapping[str, Any]) -> Files:
        """Where an ended batch's results are."""

    def results_urls(self, endpoint: Endpoint, batch: str, files: Files) -> list[str]:
        """The URLs its results are read from, in order."""

    def leftovers(self, endpoint: Endpoint, batch: str, found: Mapping[str, Any]) -> list[str]:
        """The URLs to delete once the rows of the batch ``found`` are journaled: its own."""

    def refused_for_tokens(self, batch: Mapping[str, Any]) -> bool:
        """Whether a batch that failed never ran for a queue cap, to be submitted again."""

    def failure_text(self, batch: Mapping[str, Any]) -> str:
        """One line saying why a batch failed as a whole."""

    def answer_of(self, line: Any, nonce: str) -> Answer | None:
        """The Answer of one results line, None when it names no row of the part."""

    def usage_of(self, data: Any) -> tuple[int, int]:
        """(input, output) tokens an answer says it used; (0, 0) when it says none."""


def row_failure(
    answer: Answer, facts: HttpFacts, retryable: frozenset[int], retry_if: RetryIf | None
) -> Verdict:
    """A failed row's Verdict by the live lane's retry policy: ``retry`` (a new part of the run
    may send it again, ``--batch-retries``) only for a row no one pays for: one its batch did
    not run in time, or one the provider failed (5xx) or refused for its rate (429), whether
    as a response's status or as its own error standing for one; such a row is retried when
    its status is ``retryable``, or as ``retry_if(status, "status")`` says, as a live call
    would be. Anything else is terminal, whatever ``retry_if`` says: it may have been paid."""
    kind, status = answer.error_kind or "batch_errored", answer.status_code
    answered = kind in ("status", "batch_errored") and _unpaid(status)
    again = kind == "batch_expired" or (answered and status in retryable)
    if answered and retry_if is not None:
        said = _asked(retry_if, status)
        again = again if said is None else said
    return (retry if again else terminal)(kind, answer.error or "", facts)


def _unpaid(status: int | None) -> bool:
    """Whether a row answered ``status`` is one no provider bills: it failed it, or refused it
    for its rate."""
    return status is not None and (status == 429 or status >= 500)


def _asked(retry_if: RetryIf, status: int | None) -> bool | None:
    """What ``retry_if`` says of a row failed with ``status``, as of a live call; one that
    raises or answers other than True, False or None says no."""
    try:
        said = retry_if(status, "status")
    except Exception:
        return False
    return said if said is None or isinstance(said, bool) else False


def custom_id(index: int, nonce: str) -> str:
    """The custom_id a row is submitted with: its part's nonce and its input index."""
    return f"{nonce}-{index}"


def index_of(given: object, nonce: str) -> int | None:
    """The input index a custom_id names, None when it is not one of the part ``nonce``'s."""
    if not isinstance(given, str):
        return None
    match = _CUSTOM_ID.fullmatch(given)
    return int(match.group(2)) if match and match.group(1) == nonce else None


def is_row_id(given: object) -> bool:
    """Whether ``given`` is a custom_id as batchsync writes them (of any part)."""
    return isinstance(given, str) and _CUSTOM_ID.fullmatch(given) is not None


def rfc3339_seconds(given: object) -> float | None:
    """The unix seconds of an RFC 3339 time a provider wrote (None: none, or unreadable)."""
    if not isinstance(given, str):
        return None
    try:
        return datetime.fromisoformat(given.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def one_line(text: object) -> str:
    """A provider's message as one line of at most 300 characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= 300 else flat[:299] + "…"


# The most tokens one answer may say it used (a count past it is no count: read as none).
_MOST = 2**40


def token_counts(usage: Any, names: tuple[str, str]) -> tuple[int, int]:
    """The two counts ``names`` of an answer's ``usage``; 0 for one that is no count."""
    if not isinstance(usage, Mapping):
        return 0, 0
    first, second = (usage.get(name) for name in names)
    return _count(first), _count(second)


def _count(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MOST:
        return value
    return 0


def data_page(answer: Any) -> tuple[list[Mapping[str, Any]], bool]:
    """A list page as OpenAI and Anthropic write it: ``data`` and ``has_more``."""
    if not isinstance(answer, Mapping):
        return [], False
    data = answer.get("data")
    page = [batch for batch in data if isinstance(batch, Mapping)] if isinstance(data, list) else []
    return page, answer.get("has_more") is True


def error_message(body: Any) -> Any:
    """What an error body says in ``error.message`` (OpenAI's and Anthropic's), else None."""
    error = body.get("error") if isinstance(body, Mapping) else None
    return error.get("message") if isinstance(error, Mapping) else None


class BatchesApi:
    """What OpenAI's and Anthropic's endpoints share: the batches at ``…/batches``, listed
    in ``data_page``s, the status in ``status_field``, rows named by their ``custom_id``."""

    name: str
    shape: Shape
    row_key = "custom_id"
    status_field: str

    # The list's cursor parameter (the last id of the page before).
    cursor: str

    def batches_url(self, endpoint: Endpoint) -> str:
        return f"{endpoint.base}/batches"

    def create_url(self, endpoint: Endpoint) -> str:
        return self.batches_url(endpoint)

    def upload_url(self, endpoint: Endpoint) -> str:
        return f"{endpoint.base}/files"

    def upload_start(self, name: str, size: int) -> Start | None:
        return None

    def upload_finish(self) -> dict[str, str]:
        return {}

    def file_id(self, file: Any) -> object:
        return file.get("id") if isinstance(file, Mapping) else None

    def file_label(self, file: Mapping[str, Any]) -> object:
        return file.get("filename")

    def file_params(self, cursor: str | None) -> dict[str, Any]:
        return {"purpose": "batch", "limit": 10000} | ({} if cursor is None else {"after": cursor})

    def files_listed(self, answer: Any) -> tuple[list[Mapping[str, Any]], bool, str | None]:
        return self.listed(answer)

    def batch_url(self, endpoint: Endpoint, batch: str) -> str:
        return f"{self.batches_url(endpoint)}/{batch}"

    def cancel_url(self, endpoint: Endpoint, batch: str) -> str:
        return f"{self.batch_url(endpoint, batch)}/cancel"

    def batch_id(self, batch: Mapping[str, Any]) -> object:
        return batch.get("id")

    def list_params(self, cursor: str | None) -> dict[str, Any]:
        return {"limit": 100} | ({} if cursor is None else {self.cursor: cursor})

    def listed(self, answer: Any) -> tuple[list[Mapping[str, Any]], bool, str | None]:
        page, more = data_page(answer)
        last = page[-1].get("id") if page else None
        return page, more, last if isinstance(last, str) else None

    def status_of(self, batch: Mapping[str, Any]) -> str | None:
        status = batch.get(self.status_field)
        return status if isinstance(status, str) and status in self.shape.statuses else None

    def refused_for_tokens(self, batch: Mapping[str, Any]) -> bool:
        return False

    def failure_text(self, batch: Mapping[str, Any]) -> str:
        return "the batch failed at the provider, giving no reason"

    def answer_of(self, line: Any, nonce: str) -> Answer | None:
        index = index_of(line.get(self.row_key), nonce) if isinstance(line, Mapping) else None
        return None if index is None else self.row_answer(index, line)

    def row_answer(self, index: int, line: Mapping[str, Any]) -> Answer:
        """The Answer of the results line of the row ``index``."""
        raise NotImplementedError

    def usage_of(self, data: Any) -> tuple[int, int]:
        """Its usage's input and output tokens, however the endpoint names them (a chat
        completion's prompt and completion tokens, a response's or a message's input and
        output tokens, an embedding's prompt tokens)."""
        usage = data.get("usage") if isinstance(data, Mapping) else None
        inputs, outputs = token_counts(usage, ("input_tokens", "output_tokens"))
        prompt, completion = token_counts(usage, ("prompt_tokens", "completion_tokens"))
        return inputs or prompt, outputs or completion

    def line(self, index: int, nonce: str, **fields: Any) -> bytes:
        """A row as compact JSON: its ``custom_id``, then ``fields``."""
        row = {self.row_key: custom_id(index, nonce), **fields}
        return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()
