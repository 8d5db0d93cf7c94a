"""OpenAI's Batch API (and a compatible server's): the rows uploaded as a JSONL file through
the Files API, a batch made of the file, its output and error files read back, the files
deleted once every row is journaled."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any
from urllib.parse import SplitResult, urlunsplit

from ..core.verdict import ErrorKind
from ..store.submissions import Part, Shape, well_formed
from .protocol import Answer, BatchesApi, Endpoint, Files, error_message, one_line

# The endpoints a batch may run (one per batch: the URL's path names it).
ENDPOINTS = (
    "/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses",
    "/v1/moderations", "/v1/images/generations", "/v1/images/edits", "/v1/videos",
)  # fmt: skip


class OpenAI(BatchesApi):
    name = "openai"
    shape = Shape(
        statuses=(
            "validating", "in_progress", "finalizing", "completed", "failed", "expired",
            "cancelling", "cancelled",
        ),
        ended=frozenset({"completed", "failed", "expired", "cancelled"}),
        id_forms={"file": "file-", "batch": "batch_"},
        uploads=True,
    )  # fmt: skip
    # 50 000 rows, and the uploaded file's 200 MB (decimal units, to stay under either reading).
    caps = (50_000, 200_000_000)
    identifies_rows = True  # (a batch names the file it was made of)
    cursor = "after"
    failed_status: str | None = "failed"  # (the batch failed as a whole: none of it ran)
    working = frozenset({"in_progress", "finalizing"})
    status_field = "status"

    def endpoint(self, url: SplitResult) -> Endpoint | None:
        path = url.path.rstrip("/")
        head, marker, rest = path.rpartition("/v1/")
        if not marker or f"/v1/{rest}" not in ENDPOINTS:
            return None
        base = urlunsplit((url.scheme, url.netloc, f"{head}/v1", "", ""))
        return Endpoint(self.name, url.geturl(), base, f"/v1/{rest}")

    def describe_endpoints(self) -> str:
        return "end in one of the endpoints a batch runs: " + ", ".join(ENDPOINTS)

    def request_line(
        self, endpoint: Endpoint, index: int, body: Mapping[str, Any], nonce: str
    ) -> bytes:
        return self.line(index, nonce, method="POST", url=endpoint.path, body=body)

    def submission_size(self, lines: int, line_bytes: int) -> int:
        return line_bytes + lines  # (a newline after each line)

    def create_body(
        self, endpoint: Endpoint, input_file: str | None, lines: Sequence[bytes], part: int
    ) -> bytes:
        body = {"input_file_id": input_file, "endpoint": endpoint.path, "completion_window": "24h"}
        return json.dumps(body | {"metadata": {"batchsync_part": str(part)}}).encode()

    def created_at(self, batch: Mapping[str, Any]) -> float | None:
        given = batch.get("created_at")
        if isinstance(given, int | float) and not isinstance(given, bool):
            with suppress(OverflowError):  # (a number no clock reads: no time said)
                return float(given)
        return None

    def belongs_to(self, batch: Mapping[str, Any], part: Part) -> bool:
        return part.input_file is not None and batch.get("input_file_id") == part.input_file

    def files_of(self, batch: Mapping[str, Any]) -> Files:
        return Files(*self._file_ids(batch, "output_file_id", "error_file_id"))

    def results_urls(self, endpoint: Endpoint, batch: str, files: Files) -> list[str]:
        found = (files.output, files.error)
        return [f"{endpoint.base}/files/{file_id}/content" for file_id in found if file_id]

    def leftovers(self, endpoint: Endpoint, batch: str, found: Mapping[str, Any]) -> list[str]:
        ids = self._file_ids(found, "input_file_id", "output_file_id", "error_file_id")
        return [f"{endpoint.base}/files/{file_id}" for file_id in ids if file_id]

    def _file_ids(self, batch: Mapping[str, Any], *names: str) -> list[str | None]:
        return [well_formed(self.name, "file", batch.get(name)) for name in names]

    def refused_for_tokens(self, batch: Mapping[str, Any]) -> bool:
        """Failed for the organization's enqueued-token cap: it never ran, may be resubmitted."""
        return any(error.get("code") == "token_limit_exceeded" for error in _errors(batch))

    def failure_text(self, batch: Mapping[str, Any]) -> str:
        for error in _errors(batch):
            code, message = error.get("code"), error.get("message")
            return f"{code}: {message}" if code else str(message)
        return super().failure_text(batch)

    def row_answer(self, index: int, line: Mapping[str, Any]) -> Answer:
        response, error = line.get("response"), line.get("error")
        if isinstance(response, Mapping) and isinstance(response.get("status_code"), int):
            status, body = response["status_code"], response.get("body")
            if 200 <= status < 300:
                return Answer(index, True, status, body)
            message = error_message(body)
            said = f": {one_line(message)}" if message else ""
            return Answer(index, False, status, None, "status", f"HTTP {status}{said}")
        code = error.get("code") if isinstance(error, Mapping) else None
        message = error.get("message") if isinstance(error, Mapping) else None
        kind: ErrorKind = code if code in ("batch_expired", "batch_cancelled") else "batch_errored"
        said = f"{code}: {message}" if code else message or "the provider gave no result"
        return Answer(index, False, None, None, kind, one_line(said))


def _errors(batch: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The errors a batch that failed as a whole lists."""
    errors = batch.get("errors")
    data = errors.get("data") if isinstance(errors, Mapping) else None
    return [error for error in data or () if isinstance(error, Mapping)]
