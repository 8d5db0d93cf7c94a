"""A mock of Google's Gemini API batch mode (with its Files API), served by
``batchsync.mock.server`` under ``/gemini/KEY/KNOBS``, so that a client (batchsync's, or the
google-genai SDK's with that base URL) can upload, batch, poll, cancel and download without a
key. Each KEY has its own files and batches, kept in memory.

Its routes are ``ROUTES_HELP`` below; the SDK's base URL is
``http://HOST:PORT/gemini/KEY/KNOBS``.

KNOBS: ``pace`` (seconds, 0.5: a batch is PENDING a pace, RUNNING a pace, its row k of n done
``pace * (k + 1) / n`` into it, then SUCCEEDED; a cancel ends it CANCELLED a pace later, keeping
the rows done before), ``stall_create`` (seconds: the batch is made at once, its answer that much
later). A request whose text holds ``[[error]]`` is answered an error of code 3 (400), one with
``[[500]]`` code 13 (500).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Reply = tuple[int, Any, dict[str, str]]
_VERSIONS = frozenset({"v1", "v1alpha", "v1beta"})
PENDING, RUNNING = "BATCH_STATE_PENDING", "BATCH_STATE_RUNNING"
SUCCEEDED, CANCELLED = "BATCH_STATE_SUCCEEDED", "BATCH_STATE_CANCELLED"


def rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class File:
    name: str
    display: str
    data: bytes = b""
    deleted: bool = False

    def resource(self) -> dict[str, Any]:
        return {
            "name": f"files/{self.name}", "displayName": self.display,
            "mimeType": "application/jsonl", "sizeBytes": str(len(self.data)), "state": "ACTIVE",
        }  # fmt: skip


@dataclass
class Batch:
    name: str
    model: str
    display: str
    source: str
    created: float
    pace: float
    rows: list[tuple[str, dict[str, Any]]]
    cancelled: float | None = None
    output: str | None = None
    deleted: bool = False

    def state(self, now: float) -> str:
        if self.cancelled is not None:
            return CANCELLED if now >= self.cancelled + self.pace else RUNNING
        if now < self.created + self.pace:
            return PENDING
        return RUNNING if now < self.created + 2 * self.pace else SUCCEEDED

    def done(self, index: int, now: float) -> bool:
        """Whether row ``index`` ran (before a cancel)."""
        at = self.created + self.pace + self.pace * (index + 1) / max(len(self.rows), 1)
        stop = now if self.cancelled is None else min(now, self.cancelled)
        return at <= stop


@dataclass
class Store:
    lock: threading.Lock = field(default_factory=threading.Lock)
    files: dict[str, File] = field(default_factory=dict)
    uploads: dict[str, File] = field(default_factory=dict)
    batches: dict[str, Batch] = field(default_factory=dict)
    created: int = 0


def answer_of(request: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
    """A row's generateContent answer (or its error), drawn from its text."""
    text = json.dumps(request, sort_keys=True)
    if "[[error]]" in text:
        return 400, {
            "code": 3,
            "message": "The mock refused this request.",
            "status": "INVALID_ARGUMENT",
        }
    if "[[500]]" in text:
        return 500, {"code": 13, "message": "The mock failed this request.", "status": "INTERNAL"}
    draw = int(hashlib.sha256(f"{key}\n{text}".encode()).hexdigest()[:8], 16)
    prompt, made = len(text) // 4 + 1, draw % 20 + 1
    return 200, {
        "candidates": [{
            "content": {"parts": [{"text": " ".join(["word"] * made)}], "role": "model"},
            "finishReason": "STOP", "index": 0,
        }],
        "usageMetadata": {
            "promptTokenCount": prompt, "candidatesTokenCount": made,
            "totalTokenCount": prompt + made,
        },
        "modelVersion": "mock",
    }  # fmt: skip


@dataclass(frozen=True)
class _Call:
    """One request to the mock: its KEY, method, path under the KEY's prefix, query, body,
    headers (lower-cased), the KEY's pace and the prefix as a URL."""

    key: str
    method: str
    rest: str
    query: dict[str, str]
    body: bytes
    headers: dict[str, str]
    pace: float
    prefix: str


# The routes under ``/gemini/KEY/KNOBS`` (``GeminiMock._route`` answers them; any API
# version in place of v1beta), as ``--help`` shows them.
ROUTES_HELP = (
    (
        "POST /gemini/KEY/KNOBS/upload/v1beta/files",
        "A resumable upload: X-Goog-Upload-Command: start answers an X-Goog-Upload-URL; a "
        "POST there with upload, finalize stores the bytes.",
    ),
    ("GET /gemini/KEY/KNOBS/v1beta/files", "The KEY's files."),
    ("GET|DELETE /gemini/KEY/KNOBS/v1beta/files/ID", "A file; delete it."),
    ("GET /gemini/KEY/KNOBS/download/v1beta/files/ID:download?alt=media", "A file's bytes."),
    (
        "POST /gemini/KEY/KNOBS/v1beta/models/MODEL:batchGenerateContent",
        "A batch of an uploaded JSONL file: PENDING a pace, RUNNING a pace, then SUCCEEDED.",
    ),
    ("GET /gemini/KEY/KNOBS/v1beta/batches?pageSize=N&pageToken=T", "The KEY's batches."),
    ("GET|DELETE /gemini/KEY/KNOBS/v1beta/batches/ID", "A batch; delete it."),
    ("POST /gemini/KEY/KNOBS/v1beta/batches/ID:cancel", "Cancels a batch."),
    (
        "GET /gemini/KEY/batch-stats",
        "JSON: batches_created, rows_answered, twice, files_alive, batches.",
    ),
)


class GeminiMock:
    """Every KEY's files and batches, and the answers of the ``/gemini/`` routes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[str, Store] = {}

    def _store(self, key: str) -> Store:
        with self._lock:
            return self._stores.setdefault(key, Store())

    def answer(
        self, method: str, path: str, query: dict[str, str], body: bytes, headers: dict[str, str]
    ) -> Reply:
        parts = path.strip("/").split("/")
        key = parts[1]
        if parts[2:] == ["batch-stats"]:
            return 200, self._stats(key), {}
        knobs = dict(pair.split("=", 1) for pair in parts[2].split(",") if "=" in pair)
        pace = float(knobs.get("pace", "0.5"))
        store = self._store(key)
        # (any API version: the SDK uploads to v1, batchsync to the endpoint's)
        given = [("v1beta" if part in _VERSIONS else part) for part in parts[3:6]] + parts[6:]
        rest = "/" + "/".join(given)
        prefix = f"http://{headers.get('host', '127.0.0.1')}/{'/'.join(parts[:3])}"
        call = _Call(key, method, rest, query, body, headers, pace, prefix)
        with store.lock:
            reply = self._route(store, call)
        stall = float(knobs.get("stall_create", "0"))
        if stall and rest.endswith(":batchGenerateContent"):
            time.sleep(stall)
        return reply

    def _route(self, store: Store, call: _Call) -> Reply:
        key, method, rest, query, body = call.key, call.method, call.rest, call.query, call.body
        pace = call.pace
        if rest == "/upload/v1beta/files" and method == "POST":
            return self._upload(store, call)
        if rest.endswith(":download") and rest.removeprefix("/download").startswith(
            "/v1beta/files/"
        ):  # (the REST reference's /download/v1beta/..., and the SDK's /v1beta/...)
            found = store.files.get(
                rest.removeprefix("/download")
                .removeprefix("/v1beta/files/")
                .removesuffix(":download")
            )
            if found is None or found.deleted:
                return 404, {"error": {"code": 404, "message": "no such file"}}, {}
            return 200, found.data, {"Content-Type": "application/octet-stream"}
        if rest == "/v1beta/files" and method == "GET":
            alive = [f.resource() for f in reversed(store.files.values()) if not f.deleted]
            return 200, {"files": alive}, {}
        if rest.startswith("/v1beta/files/"):
            found = store.files.get(rest.removeprefix("/v1beta/files/"))
            if found is None or found.deleted:
                return 404, {"error": {"code": 404, "message": "no such file"}}, {}
            if method == "DELETE":
                found.deleted = True
                return 200, {}, {}
            return 200, found.resource(), {}
        if rest.endswith(":batchGenerateContent") and method == "POST":
            return self._create(store, key, rest, body, pace)
        if rest == "/v1beta/batches" and method == "GET":
            return self._list(store, query)
        if rest.startswith("/v1beta/batches/"):
            return self._one(store, key, method, rest.removeprefix("/v1beta/batches/"))
        return 404, {"error": {"code": 404, "message": f"no route {rest}"}}, {}

    def _upload(self, store: Store, call: _Call) -> Reply:
        query, body, prefix = call.query, call.body, call.prefix
        command = call.headers.get("x-goog-upload-command", "")
        if "start" in command:
            meta = json.loads(body or b"{}").get("file", {})
            upload = uuid.uuid4().hex[:12]
            store.uploads[upload] = File(uuid.uuid4().hex[:12], str(meta.get("displayName", "")))
            url = f"{prefix}/upload/v1beta/files?upload_id={upload}"
            return 200, {}, {"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active"}
        pending = store.uploads.get(query.get("upload_id", ""))
        if pending is None:
            return 404, {"error": {"code": 404, "message": "no such upload"}}, {}
        pending.data += body
        if "finalize" not in command:
            return 200, {}, {"X-Goog-Upload-Status": "active"}
        del store.uploads[query["upload_id"]]
        store.files[pending.name] = pending
        return 200, {"file": pending.resource()}, {"X-Goog-Upload-Status": "final"}

    def _create(self, store: Store, key: str, rest: str, body: bytes, pace: float) -> Reply:
        given = json.loads(body or b"{}").get("batch", {})
        source = str(given.get("inputConfig", {}).get("fileName", "")).removeprefix("files/")
        found = store.files.get(source)
        if found is None or found.deleted:
            return (
                400,
                {"error": {"code": 400, "message": "inputConfig.fileName: no such file"}},
                {},
            )
        rows = []
        for line in found.data.splitlines():
            if line.strip():
                row = json.loads(line)
                rows.append((str(row.get("key")), row.get("request") or {}))
        model = rest.removeprefix("/v1beta/").removesuffix(":batchGenerateContent")
        batch = Batch(uuid.uuid4().hex[:14], model, str(given.get("displayName", "")), source,
                      time.time(), pace, rows)  # fmt: skip
        store.batches[batch.name] = batch
        store.created += 1
        return 200, self._operation(store, key, batch), {}

    def _list(self, store: Store, query: dict[str, str]) -> Reply:
        names = [n for n, b in reversed(store.batches.items()) if not b.deleted]
        size = int(query.get("pageSize", "50"))
        token = query.get("pageToken", "0")
        start = int(token) if token.isdigit() else 0  # (a token not its own: from the start)
        page = names[start : start + size]
        answer: dict[str, Any] = {"operations": [self._operation(store, "", store.batches[n])
                                                 for n in page]}  # fmt: skip
        if start + size < len(names):
            answer["nextPageToken"] = str(start + size)
        return 200, answer, {}

    def _one(self, store: Store, key: str, method: str, rest: str) -> Reply:
        name, _, action = rest.partition(":")
        batch = store.batches.get(name)
        if batch is None or batch.deleted:
            return 404, {"error": {"code": 404, "message": "no such batch"}}, {}
        if action == "cancel" and method == "POST":
            if batch.state(time.time()) in (PENDING, RUNNING) and batch.cancelled is None:
                batch.cancelled = time.time()
            return 200, {}, {}
        if method == "DELETE":
            batch.deleted = True
            return 200, {}, {}
        return 200, self._operation(store, key, batch), {}

    def _operation(self, store: Store, key: str, batch: Batch) -> dict[str, Any]:
        now = time.time()
        state = batch.state(now)
        metadata: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
            "model": batch.model, "displayName": batch.display, "state": state,
            "createTime": rfc3339(batch.created), "updateTime": rfc3339(now),
            "inputConfig": {"fileName": f"files/{batch.source}"},
            "batchStats": {"requestCount": str(len(batch.rows))},
        }  # fmt: skip
        operation: dict[str, Any] = {"name": f"batches/{batch.name}", "metadata": metadata}
        if state in (SUCCEEDED, CANCELLED):
            if batch.output is None:
                batch.output = self._results(store, key, batch, now)
            metadata["output"] = {"responsesFile": f"files/{batch.output}"}
            operation["done"] = True
            operation["response"] = {"responsesFile": f"files/{batch.output}"}
        return operation

    def _results(self, store: Store, key: str, batch: Batch, now: float) -> str:
        lines = []
        for index, (row_key, request) in enumerate(batch.rows):
            if batch.done(index, now):
                status, answer = answer_of(request, key)
                field_name = "response" if status == 200 else "error"
                lines.append(json.dumps({"key": row_key, field_name: answer}))
            else:
                lines.append(json.dumps({"key": row_key, "error": {
                    "code": 1, "message": "cancelled", "status": "CANCELLED"}}))  # fmt: skip
        output = File(uuid.uuid4().hex[:12], f"results of {batch.name}",
                      "\n".join(lines).encode() + b"\n")  # fmt: skip
        store.files[output.name] = output
        return output.name

    def _stats(self, key: str) -> dict[str, Any]:
        store = self._store(key)
        now = time.time()
        with store.lock:
            seen: dict[str, int] = {}
            for batch in store.batches.values():
                for index, (_, request) in enumerate(batch.rows):
                    if batch.done(index, now):
                        text = json.dumps(request, sort_keys=True)
                        seen[text] = seen.get(text, 0) + 1
            return {
                "batches_created": store.created,
                "rows_answered": sum(seen.values()),
                "twice": sorted(text for text, times in seen.items() if times > 1),
                "files_alive": [f.name for f in store.files.values() if not f.deleted],
                "batches": [
                    {"name": b.name, "state": b.state(now), "rows": len(b.rows),
                     "deleted": b.deleted} for b in store.batches.values()
                ],
            }  # fmt: skip
