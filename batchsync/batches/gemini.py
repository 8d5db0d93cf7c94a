"""Google's Gemini API batch mode (and a compatible server's): the rows uploaded as a JSONL
file through the Files API (``{"key", "request"}`` a line), a batch made of the file with
``models/{model}:batchGenerateContent``, its state in the operation's metadata, its results a
JSONL file of ``{"key", "response"}`` or ``{"key", "error"}`` lines; the batch and its files
deleted once every row is journaled.

A batch and a file are named ``batches/ID`` and ``files/ID``: the journal keeps the ID.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import SplitResult, urlunsplit

from ..store.submissions import Part, Shape, well_formed
from .protocol import (
    Answer,
    Endpoint,
    Files,
    Start,
    custom_id,
    index_of,
    one_line,
    rfc3339_seconds,
    token_counts,
)

_LIVE = ":generateContent"
_BATCHES, _FILES = "batches/", "files/"
# google.rpc's code of a call cancelled (a row its cancelled batch did not run).
_CANCELLED = 1
# The HTTP status each google.rpc code stands for (a row's error carries the rpc code).
_HTTP_OF_RPC = {
    1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409,
    11: 400, 12: 501, 13: 500, 14: 503, 15: 500, 16: 401,
}  # fmt: skip


class Gemini:
    name = "gemini"
    shape = Shape(
        statuses=(
            "BATCH_STATE_PENDING", "BATCH_STATE_RUNNING", "BATCH_STATE_SUCCEEDED",
            "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED",
        ),
        ended=frozenset({
            "BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED",
            "BATCH_STATE_EXPIRED",
        }),
        id_forms={"file": "", "batch": ""},
        uploads=True,
    )  # fmt: skip
    # The input file's 2 GB; rows: none documented, kept to a part that reads back quickly.
    caps = (100_000, 2_000_000_000)
    identifies_rows = True  # (a batch names the file it was made of)
    failed_status: str | None = "BATCH_STATE_FAILED"
    working = frozenset({"BATCH_STATE_RUNNING"})
    row_key = "key"

    def endpoint(self, url: SplitResult) -> Endpoint | None:
        path = url.path.rstrip("/")
        head, marker, model = path.rpartition("/models/")
        if not marker or not model.endswith(_LIVE) or "/" in model:
            return None
        base = urlunsplit((url.scheme, url.netloc, head, "", ""))
        return Endpoint(self.name, url.geturl(), base, f"models/{model.removesuffix(_LIVE)}")

    def describe_endpoints(self) -> str:
        return "end in /models/MODEL:generateContent"

    def batches_url(self, endpoint: Endpoint) -> str:
        return f"{endpoint.base}/batches"

    def create_url(self, endpoint: Endpoint) -> str:
        return f"{endpoint.base}/{endpoint.path}:batchGenerateContent"

    def batch_url(self, endpoint: Endpoint, batch: str) -> str:
        return f"{self.batches_url(endpoint)}/{batch}"

    def cancel_url(self, endpoint: Endpoint, batch: str) -> str:
        return f"{self.batch_url(endpoint, batch)}:cancel"

    def batch_id(self, batch: Mapping[str, Any]) -> object:
        return _named(batch.get("name"), _BATCHES)

    def list_params(self, cursor: str | None) -> dict[str, Any]:
        return {"pageSize": 100} | ({} if cursor is None else {"pageToken": cursor})

    def listed(self, answer: Any) -> tuple[list[Mapping[str, Any]], bool, str | None]:
        return _page(answer, "operations")

    def upload_url(self, endpoint: Endpoint) -> str:
        root, _, version = endpoint.base.rpartition("/")
        return f"{root}/upload/{version}/files"

    def upload_start(self, name: str, size: int) -> Start | None:
        headers = {
            "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
            "X-Goog-Upload-Header-Content-Length": str(size),
            "X-Goog-Upload-Header-Content-Type": "application/jsonl",
            "Content-Type": "application/json",
        }  # fmt: skip
        return headers, json.dumps({"file": {"displayName": name}}).encode(), "X-Goog-Upload-URL"

    def upload_finish(self) -> dict[str, str]:
        return {"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "0"}

    def file_id(self, file: Any) -> object:
        if isinstance(file, Mapping) and isinstance(file.get("file"), Mapping):
            file = file["file"]  # (an upload's answer holds the file)
        return _named(file.get("name"), _FILES) if isinstance(file, Mapping) else None

    def file_label(self, file: Mapping[str, Any]) -> object:
        return file.get("displayName")

    def file_params(self, cursor: str | None) -> dict[str, Any]:
        return self.list_params(cursor)

    def files_listed(self, answer: Any) -> tuple[list[Mapping[str, Any]], bool, str | None]:
        return _page(answer, "files")

    def request_line(
        self, endpoint: Endpoint, index: int, body: Mapping[str, Any], nonce: str
    ) -> bytes:
        line = {self.row_key: custom_id(index, nonce), "request": body}
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()

    def submission_size(self, lines: int, line_bytes: int) -> int:
        return line_bytes + lines  # (a newline after each line)

    def create_body(
        self, endpoint: Endpoint, input_file: str | None, lines: Sequence[bytes], part: int
    ) -> bytes:
        batch = {
            "displayName": f"batchsync part {part}",
            "inputConfig": {"fileName": f"{_FILES}{input_file}"},
        }
        return json.dumps({"batch": batch}).encode()

    def status_of(self, batch: Mapping[str, Any]) -> str | None:
        state = _metadata(batch).get("state")
        return state if isinstance(state, str) and state in self.shape.statuses else None

    def created_at(self, batch: Mapping[str, Any]) -> float | None:
        return rfc3339_seconds(_metadata(batch).get("createTime"))

    def belongs_to(self, batch: Mapping[str, Any], part: Part) -> bool:
        config = _metadata(batch).get("inputConfig")
        named = config.get("fileName") if isinstance(config, Mapping) else None
        return part.input_file is not None and named == f"{_FILES}{part.input_file}"

    def files_of(self, batch: Mapping[str, Any]) -> Files:
        output = _metadata(batch).get("output")
        given = output.get("responsesFile") if isinstance(output, Mapping) else None
        return Files(well_formed(self.name, "file", _named(given, _FILES)))

    def results_urls(self, endpoint: Endpoint, batch: str, files: Files) -> list[str]:
        root = endpoint.base.rpartition("/")[0]
        version = endpoint.base.rpartition("/")[2]
        return [f"{root}/download/{version}/files/{files.output}:download?alt=media"] if (
            files.output) else []  # fmt: skip

    def leftovers(self, endpoint: Endpoint, batch: str, found: Mapping[str, Any]) -> list[str]:
        config, output = _metadata(found).get("inputConfig"), self.files_of(found).output
        given = config.get("fileName") if isinstance(config, Mapping) else None
        files = [well_formed(self.name, "file", _named(given, _FILES)), output]
        return [f"{endpoint.base}/files/{name}" for name in files if name] + [
            self.batch_url(endpoint, batch)
        ]

    def refused_for_tokens(self, batch: Mapping[str, Any]) -> bool:
        return False

    def failure_text(self, batch: Mapping[str, Any]) -> str:
        error = batch.get("error")
        message = error.get("message") if isinstance(error, Mapping) else None
        return (
            one_line(message) if message else "the batch failed at the provider, giving no reason"
        )

    def answer_of(self, line: Any, nonce: str) -> Answer | None:
        index = index_of(line.get(self.row_key), nonce) if isinstance(line, Mapping) else None
        if index is None:
            return None
        response, error = line.get("response"), line.get("error")
        if isinstance(response, Mapping):
            return Answer(index, True, 200, response)
        code = error.get("code") if isinstance(error, Mapping) else None
        said = error.get("message") if isinstance(error, Mapping) else None
        if code == _CANCELLED:  # (the batch was cancelled before it ran the row)
            return Answer(index, False, None, None, "batch_cancelled", "the batch was cancelled")
        status = _HTTP_OF_RPC.get(code) if isinstance(code, int) else None
        return Answer(index, False, status, None, "batch_errored",
                      one_line(said or "the provider gave no result"))  # fmt: skip

    def usage_of(self, data: Any) -> tuple[int, int]:
        usage = data.get("usageMetadata") if isinstance(data, Mapping) else None
        return token_counts(usage, ("promptTokenCount", "candidatesTokenCount"))


def _page(answer: Any, name: str) -> tuple[list[Mapping[str, Any]], bool, str | None]:
    """A page of a list (its entries under ``name``), whether more follow, and the token of
    the next page."""
    given = answer.get(name) if isinstance(answer, Mapping) else None
    page = [entry for entry in given if isinstance(entry, Mapping)] if isinstance(
        given, list) else []  # fmt: skip
    token = answer.get("nextPageToken") if isinstance(answer, Mapping) else None
    token = token if isinstance(token, str) and token else None
    return page, token is not None, token


def _metadata(batch: Mapping[str, Any]) -> Mapping[str, Any]:
    """A batch operation's metadata (the batch itself), or the mapping when it is no
    operation (a batch as ``batches.get`` may give it)."""
    metadata = batch.get("metadata")
    return metadata if isinstance(metadata, Mapping) else batch


def _named(given: object, kind: str) -> str | None:
    """The ID of a name ``kind`` + ID (``batches/ID``, ``files/ID``); None for another."""
    return given.removeprefix(kind) if isinstance(given, str) and given.startswith(kind) else None
