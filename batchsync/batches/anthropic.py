"""Anthropic's Message Batches (and a compatible server's): the rows sent in the create
itself, the results read from the batch's results URL, the batch deleted once every row is
journaled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import SplitResult, urlunsplit

from ..store.submissions import Part, Shape
from .protocol import Answer, BatchesApi, Endpoint, Files, one_line, rfc3339_seconds

# Its error types as the HTTP status a live call would have been answered with.
_STATUS = {
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


class Anthropic(BatchesApi):
    name = "anthropic"
    shape = Shape(
        statuses=("in_progress", "canceling", "ended"),
        ended=frozenset({"ended"}),
        id_forms={"batch": "msgbatch_"},
        uploads=False,
    )
    # 100 000 rows, and the create request's 256 MB.
    caps = (100_000, 256_000_000)
    identifies_rows = False  # (its list says how many rows a batch has, nothing of which)
    cursor = "after_id"
    failed_status: str | None = None  # (its batches do not fail as a whole)
    working = frozenset({"in_progress"})
    # (nor for tokens: its queue cap refuses the create itself, with a 429)
    status_field = "processing_status"

    def endpoint(self, url: SplitResult) -> Endpoint | None:
        path = url.path.rstrip("/")
        if not path.endswith("/messages"):
            return None
        base = urlunsplit((url.scheme, url.netloc, path, "", ""))
        return Endpoint(self.name, url.geturl(), base, "/v1/messages")

    def describe_endpoints(self) -> str:
        return "be a Messages endpoint (…/v1/messages)"

    def request_line(
        self, endpoint: Endpoint, index: int, body: Mapping[str, Any], nonce: str
    ) -> bytes:
        return self.line(index, nonce, params=body)

    def submission_size(self, lines: int, line_bytes: int) -> int:
        # ('{"requests":[' and ']}' around the rows, a comma between two)
        return line_bytes + max(lines - 1, 0) + len('{"requests":[]}')

    def create_body(
        self, endpoint: Endpoint, input_file: str | None, lines: Sequence[bytes], part: int
    ) -> bytes:
        return b'{"requests":[' + b",".join(lines) + b"]}"

    def created_at(self, batch: Mapping[str, Any]) -> float | None:
        return rfc3339_seconds(batch.get("created_at"))

    def belongs_to(self, batch: Mapping[str, Any], part: Part) -> bool:
        counts = batch.get("request_counts")
        if not isinstance(counts, Mapping):
            return False
        total = sum(value for value in counts.values() if isinstance(value, int))
        return total == part.size

    def files_of(self, batch: Mapping[str, Any]) -> Files:
        url = batch.get("results_url")
        return Files(results_url=url if isinstance(url, str) else None)

    def results_urls(self, endpoint: Endpoint, batch: str, files: Files) -> list[str]:
        return [files.results_url or f"{self.batch_url(endpoint, batch)}/results"]

    def leftovers(self, endpoint: Endpoint, batch: str, found: Mapping[str, Any]) -> list[str]:
        return [self.batch_url(endpoint, batch)]

    def row_answer(self, index: int, line: Mapping[str, Any]) -> Answer:
        result = line.get("result")
        result = result if isinstance(result, Mapping) else {}
        kind = result.get("type")
        if kind == "succeeded":
            return Answer(index, True, 200, result.get("message"))
        if kind == "expired":
            return Answer(
                index, False, None, None, "batch_expired", "the batch expired before it ran"
            )
        if kind == "canceled":
            return Answer(index, False, None, None, "batch_cancelled", "the batch was cancelled")
        error = result.get("error")
        inner = error.get("error") if isinstance(error, Mapping) else None
        if isinstance(inner, Mapping):
            status = _STATUS.get(str(inner.get("type")))
            text = one_line(f"{inner.get('type')}: {inner.get('message')}")
            return Answer(index, False, status, None, "batch_errored", text)
        return Answer(index, False, None, None, "batch_errored", "the provider gave no result")
