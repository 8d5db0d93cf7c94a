"""A mock of OpenAI's Batch API (with its Files API) and Anthropic's Message Batches API,
served by ``batchsync.mock.server`` under the mock LLM API's prefix (``batchsync.mock.llm``),
so that a client of either SDK can submit, poll, cancel and download batches without a key.

Its routes are ``ROUTES_HELP`` below (KEY and LIMITS as for the live routes: each KEY has
its own files and batches, kept in memory; the first request of a KEY, live or batch, fixes
its limits and knobs). SDK base URLs: ``http://HOST:PORT/llm/KEY/LIMITS/v1`` for OpenAI's,
``http://HOST:PORT/llm/KEY/LIMITS`` for Anthropic's.

Knobs, given in LIMITS next to the live limits (``pace=0.1,expire=0.2,enqueued=5000``):

* ``pace`` (seconds, 0.5): the length of each step. An OpenAI batch is ``validating``, then
  ``in_progress``, then ``finalizing`` a ``pace`` each, then ``completed`` (or ``expired``);
  an Anthropic batch is ``in_progress`` for 2 ``pace``, then ``ended``. Row k of n is done
  ``pace * (k + 1) / n`` after the batch went in progress (in submission order), so a
  cancel keeps the answers of the rows done before it; a cancelled batch is ``cancelling``
  (``canceling``) one ``pace``, then ``cancelled`` (``ended``). Nothing runs in the
  background: every state is worked out from the clock when the batch is read.
* ``expire`` (0 to 1, 0): the share of rows that expire, picked by a hash of KEY and
  ``custom_id``; a row whose body contains ``[[expire]]`` expires too. A batch with an
  expired row ends ``expired`` (OpenAI: its rows in the error file as ``batch_expired``;
  Anthropic: the batch ends as usual, those rows' result ``expired``), the others answered.
* ``fail`` (0 to 1, 0): the share of rows answered 400 (picked the same way), as is a row
  whose body contains ``[[error]]``; a body with ``[[500]]`` is answered 500. OpenAI: the
  output line's ``status_code`` with OpenAI's error body; Anthropic: an ``errored`` result
  (``invalid_request_error``, or ``api_error`` for a 500).
* ``enqueued`` (tokens, 0: no cap): the tokens that the KEY's batches not yet ended may hold
  (a batch's tokens: each row's prompt plus its ``max_tokens``, as the live routes count).
  Over it, an OpenAI batch is created but fails after one ``pace`` of ``validating`` with
  ``token_limit_exceeded`` (as OpenAI's do), never running; an Anthropic create is answered
  429 ``rate_limit_error`` with ``retry-after: 1``.
* ``shuffle`` (1 or 0, 1): results list the rows in an order shuffled by the batch's id (0:
  in submission order).
* ``batch_rows`` and ``batch_bytes``: the most rows and bytes of a file or batch (OpenAI
  50 000 and 200 MB, Anthropic 100 000 and 256 MB); more is answered 400.
* ``stall_upload``, ``stall_create``, ``stall_results`` (seconds, 0): an upload, a create or
  a results download is done at once (the file stored, the batch made) but answered this
  much later, so that a test can kill its client in that moment.

Each row is answered with the body the live route would give the same body on the same KEY
(the same lengths and ``usage``: the draws are seeded by KEY and body), but batch rows do not
count against the KEY's live limits.

The batch stats are JSON: ``files_uploaded``, ``files_deleted``, ``files_alive`` (ids of the
files not deleted, outputs included), ``batches_created`` (creates answered 200, the ones the
cap fails later included), ``refused_creates`` (creates the cap refused or failed),
``billed`` (the ``input_tokens`` and ``output_tokens`` of every row answered 200 so far, by
the usage its answer reports: what the KEY pays at the batch price),
``batches_run`` and ``rows_run`` (batches that went in progress, and their rows), ``twice``
(each request body answered in more than one batch, whatever its custom_ids: a client that
resubmits what already ran shows here; rows that expired or were cancelled before they ran,
and answers of the provider's own failure (5xx), which are not billed, do not count),
``rows_answered`` (the rows answered that count there, over every batch), ``both_lanes``
(each body answered both by a batch and live, 200, on the same KEY: a client whose rows
were paid in both lanes shows here), ``batches_deleted``, ``auth`` (the distinct
``Authorization`` and ``x-api-key`` values the batch routes saw) and ``batches`` (each one's
``id``, ``provider``, ``status``, ``rows``, ``tokens`` and ``created_at``).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy
from email.parser import BytesParser
from typing import Any

from .llm import (
    Limits,
    LLMMock,
    chat_cost,
    embeddings_cost,
    max_tokens_of,
    parse_limits,
    prompt_tokens,
    text_tokens,
    unlimited_answer,
)

Payload = dict[str, Any] | bytes
BatchReply = tuple[int, Payload, dict[str, str]]
JSONReply = tuple[int, dict[str, Any], dict[str, str]]

OPENAI, ANTHROPIC = "openai", "anthropic"
OPENAI_URLS = (
    "/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses",
    "/v1/moderations", "/v1/images/generations", "/v1/images/edits", "/v1/videos",
)  # fmt: skip
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
DAY = 24 * 3600
# The most rows and bytes of a batch when the knobs do not say.
MOST = {OPENAI: (50_000, 200_000_000), ANTHROPIC: (100_000, 256_000_000)}
OPEN = {OPENAI: ("validating", "in_progress", "finalizing"), ANTHROPIC: ("in_progress",)}
EXPIRED, CANCELLED = "expired", "cancelled"


@dataclass(frozen=True)
class Settings:
    """A KEY's batch knobs (the module's doc), read from its limits."""

    pace: float = 0.5
    expire: float = 0.0
    fail: float = 0.0
    enqueued: int = 0
    shuffle: bool = True
    batch_rows: int = 0
    batch_bytes: int = 0
    stall_upload: float = 0.0
    stall_create: float = 0.0
    stall_results: float = 0.0

    @classmethod
    def of(cls, limits: Limits) -> Settings:
        knobs = dict(limits.batch)
        return cls(
            pace=knobs.get("pace", 0.5),
            expire=knobs.get("expire", 0.0),
            fail=knobs.get("fail", 0.0),
            enqueued=int(knobs.get("enqueued", 0)),
            shuffle=bool(knobs.get("shuffle", 1)),
            batch_rows=int(knobs.get("batch_rows", 0)),
            batch_bytes=int(knobs.get("batch_bytes", 0)),
            stall_upload=knobs.get("stall_upload", 0.0),
            stall_create=knobs.get("stall_create", 0.0),
            stall_results=knobs.get("stall_results", 0.0),
        )

    def stall(self, method: str, route: list[str]) -> float:
        """Seconds to hold the answer to this call (``route``: the path after ``v1``): an
        upload, a create or a results download, done at once and answered late, so that a
        test can stop its client in that moment."""
        if method == "POST" and route in (["files"], ["batches"], ["messages", "batches"]):
            return self.stall_upload if route == ["files"] else self.stall_create
        if method == "GET" and route[-1:] in (["content"], ["results"]):
            return self.stall_results
        return 0.0

    def most(self, provider: str) -> tuple[int, int]:
        """The most rows and bytes a batch of ``provider`` may have."""
        rows, size = MOST[provider]
        return self.batch_rows or rows, self.batch_bytes or size


# The tokens a KEY's batches billed, by side: the usage of every row answered 200 so far
# (OpenAI's names, then Anthropic's).
BILLED = {
    "input_tokens": ("prompt_tokens", "input_tokens"),
    "output_tokens": ("completion_tokens", "output_tokens"),
}


def canonical(body: Any) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def share(key: str, custom_id: str, salt: str) -> float:
    """A number in [0, 1) fixed by KEY and ``custom_id``: which rows the knobs pick."""
    digest = hashlib.sha256(f"{key}\n{custom_id}\n{salt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def fate_of(key: str, custom_id: str, text: str, settings: Settings) -> str:
    """What becomes of a row: "answer", "expire", "error" (400) or "500"."""
    if "[[expire]]" in text:
        return "expire"
    if "[[500]]" in text:
        return "500"
    if "[[error]]" in text:
        return "error"
    if share(key, custom_id, "expire") < settings.expire:
        return "expire"
    if share(key, custom_id, "fail") < settings.fail:
        return "error"
    return "answer"


def row_tokens(route: str, body: dict[str, Any]) -> int:
    """A row's tokens against the enqueued cap: its prompt plus its ``max_tokens``."""
    if route == "v1/embeddings":
        cost = embeddings_cost(body)
        return cost if isinstance(cost, int) else 0
    if route == "v1/chat/completions":
        cost = chat_cost(body)
        if isinstance(cost, int):
            return cost
    messages = body.get("messages")
    if isinstance(messages, list):
        prompt = prompt_tokens(messages, body.get("system"))
    else:
        prompt = text_tokens(str(body.get("input", body.get("prompt", ""))))
    return prompt + (max_tokens_of(body) or 0)


@dataclass
class Row:
    """One request of a batch."""

    custom_id: str
    route: str  # ("v1/chat/completions", "v1/messages", ...)
    body: dict[str, Any]
    text: str  # (the body's JSON, keys sorted)
    fate: str
    tokens: int


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: float
    rows: list[Row] = field(default_factory=list)
    deleted: bool = False

    def object(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": int(self.created_at),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


@dataclass
class Batch:
    """A batch of either provider, its states worked out from its times when read."""

    id: str
    provider: str
    rows: list[Row]
    created: float
    pace: float
    tokens: int
    model: str
    endpoint: str = ""
    input_file_id: str = ""
    metadata: Any = None
    refused: bool = False  # (OpenAI: failed for the enqueued cap, never runs)
    cancel_at: float | None = None
    answers: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    finished: bool = False
    output_file_id: str | None = None
    error_file_id: str | None = None
    results: bytes = b""
    final_counts: dict[str, int] = field(default_factory=dict)
    deleted: bool = False

    @property
    def started(self) -> float:
        """When it goes in progress: after validating (OpenAI), at once (Anthropic)."""
        return self.created + (self.pace if self.provider == OPENAI else 0.0)

    @property
    def end(self) -> float:
        """When it reaches its final state."""
        if self.refused:
            return self.created + self.pace
        if self.cancel_at is not None:
            return self.cancel_at + self.pace
        return (
            self.created + 3 * self.pace
            if self.provider == OPENAI
            else self.started + 2 * self.pace
        )

    def done_at(self, index: int) -> float:
        return self.started + self.pace * (index + 1) / len(self.rows)

    def ran(self, now: float) -> bool:
        """Whether it went in progress (by ``now``)."""
        if self.refused or now < self.started:
            return False
        return self.cancel_at is None or self.cancel_at > self.started

    def done(self, index: int, now: float) -> bool:
        """Whether row ``index`` was answered by ``now`` (and before any cancel)."""
        if self.rows[index].fate == "expire":
            return False
        cut = now if self.cancel_at is None else min(now, self.cancel_at)
        return self.ran(now) and self.done_at(index) <= cut

    def status(self, now: float) -> str:
        if self.provider == ANTHROPIC:
            if self.cancel_at is not None and now < self.end:
                return "canceling"
            return "in_progress" if now < self.end else "ended"
        if self.refused:
            return "validating" if now < self.end else "failed"
        if self.cancel_at is not None:
            return "cancelling" if now < self.end else CANCELLED
        if now < self.started:
            return "validating"
        if now < self.started + self.pace:
            return "in_progress"
        if now < self.end:
            return "finalizing"
        return EXPIRED if any(row.fate == "expire" for row in self.rows) else "completed"

    def is_open(self, now: float) -> bool:
        """Whether its tokens count against the enqueued cap."""
        return not self.refused and self.status(now) in OPEN[self.provider]

    def outcome(self, index: int) -> str:
        """A row's end once the batch is over: "answered", "expired" or "cancelled"."""
        if self.done(index, self.end):
            return "answered"
        return EXPIRED if self.cancel_at is None else CANCELLED


def openai_error(
    status: int, message: str, kind: str = "invalid_request_error", **extra: Any
) -> JSONReply:
    error = {"message": message, "type": kind, "param": None, "code": None, **extra}
    return status, {"error": error}, {}


def anthropic_error(status: int, message: str, kind: str = "invalid_request_error") -> JSONReply:
    return status, {"type": "error", "error": {"type": kind, "message": message}}, {}


def unix(moment: float | None) -> int | None:
    return None if moment is None else int(moment)


def rfc3339(moment: float | None) -> str | None:
    """An RFC 3339 time in UTC to the millisecond, as Anthropic's batch times are."""
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def form_fields(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A multipart/form-data body's fields: name -> (file name, bytes); ValueError if it is
    not one."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise ValueError("the upload must be multipart/form-data")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise ValueError("the multipart body has no parts")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.walk():
        if part.is_multipart():
            continue
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str):
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


@dataclass
class Store:
    """One KEY's files, batches and counts, under one lock."""

    key: str
    settings: Settings
    lock: threading.Lock = field(default_factory=threading.Lock)
    files: dict[str, StoredFile] = field(default_factory=dict)
    batches: dict[str, Batch] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    auth: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        names = ("files_uploaded", "files_deleted", "batches_created", "refused_creates")
        self.counts = dict.fromkeys((*names, "batches_deleted"), 0)


# The batch routes under ``/llm/KEY/LIMITS/`` (``BatchMock.handles`` says which paths are
# theirs), as ``--help`` shows them.
ROUTES_HELP = (
    ("POST /llm/KEY/LIMITS/v1/files", "OpenAI's Files API: an upload (multipart: purpose, file)."),
    ("GET /llm/KEY/LIMITS/v1/files", "The KEY's files, newest first."),
    ("GET|DELETE /llm/KEY/LIMITS/v1/files/ID", "A file object; delete it."),
    ("GET /llm/KEY/LIMITS/v1/files/ID/content", "A file's bytes."),
    (
        "POST /llm/KEY/LIMITS/v1/batches",
        "OpenAI's Batch API: a batch of an uploaded file, its states stepped by the clock.",
    ),
    ("GET /llm/KEY/LIMITS/v1/batches?limit=N&after=ID", "The KEY's batches, newest first."),
    ("GET /llm/KEY/LIMITS/v1/batches/ID", "A batch object."),
    ("POST /llm/KEY/LIMITS/v1/batches/ID/cancel", "Cancels a batch."),
    (
        "POST /llm/KEY/LIMITS/v1/messages/batches",
        "Anthropic's Message Batches API: a batch of requests.",
    ),
    (
        "GET /llm/KEY/LIMITS/v1/messages/batches?limit=N&after_id=ID&before_id=ID",
        "The KEY's message batches.",
    ),
    ("GET|DELETE /llm/KEY/LIMITS/v1/messages/batches/ID", "A message batch; delete an ended one."),
    ("GET /llm/KEY/LIMITS/v1/messages/batches/ID/results", "Its results, JSONL, once ended."),
    ("POST /llm/KEY/LIMITS/v1/messages/batches/ID/cancel", "Cancels a message batch."),
    (
        "GET /llm/KEY/batch-stats",
        "JSON: files and batches of the KEY, rows run, rows run twice, refused creates, the "
        "keys seen.",
    ),
)


class BatchMock:
    """Every KEY's files and batches, and the answers of the batch routes under ``/llm/``."""

    def __init__(self, llm: LLMMock) -> None:
        self.llm = llm
        self._lock = threading.Lock()
        self._stores: dict[str, Store] = {}

    @staticmethod
    def handles(path: str) -> bool:
        """Whether a path under ``/llm/`` is one of the batch routes."""
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[2] == "batch-stats":
            return True
        rest = parts[3:]
        return rest[:2] in (["v1", "files"], ["v1", "batches"]) or (
            rest[:3] == ["v1", "messages", "batches"]
        )

    def answer(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: bytes,
        headers: Mapping[str, str],
    ) -> BatchReply:
        """The status, payload (JSON, or bytes with their Content-Type among the headers) and
        headers for a request to a batch route; ``headers`` are the request's, lower-cased."""
        parts = path.strip("/").split("/")
        key = parts[1]
        if parts[2] == "batch-stats":
            store = self._stores.get(key)
            if store is None or method != "GET":
                return 404, {"error": f"no batch requests for key {key!r} yet"}, {}
            return 200, self._stats(store, self.llm.answered_live(key)), {}
        rest = parts[3:]
        anthropic = rest[:3] == ["v1", "messages", "batches"]
        try:
            account = self.llm.account(key, parse_limits(parts[2]))
        except ValueError as problem:
            if anthropic:
                return anthropic_error(400, str(problem))
            return openai_error(400, str(problem))
        store = self._store(key, Settings.of(account.limits))
        with store.lock:
            store.auth.update(
                value for name in ("authorization", "x-api-key") if (value := headers.get(name))
            )
            if anthropic:
                prefix = f"http://{headers.get('host', '127.0.0.1')}/{'/'.join(parts[:3])}"
                reply = self._anthropic(
                    store, method, rest[3:], query=query, body=body, prefix=prefix
                )
            else:
                reply = self._openai(
                    store, method, rest[1:], query=query, body=body, headers=headers
                )
        time.sleep(store.settings.stall(method, rest[1:]))  # (done already; answered late)
        return reply

    def _store(self, key: str, settings: Settings) -> Store:
        """KEY's store, with the knobs its first request gave (its limits make sure they are
        the same for every request)."""
        with self._lock:
            return self._stores.setdefault(key, Store(key, settings))

    # OpenAI

    def _openai(
        self,
        store: Store,
        method: str,
        route: list[str],
        *,
        query: dict[str, str],
        body: bytes,
        headers: Mapping[str, str],
    ) -> BatchReply:
        """The Files and Batch routes (``route``: the path after ``v1``)."""
        now = time.time()
        head, tail = route[0], route[1:]
        reply = None
        if head == "files":
            reply = self._files(store, method, tail, query=query, upload=(headers, body), now=now)
        elif head == "batches":
            reply = self._batches(store, method, tail, query=query, body=body, now=now)
        return reply or openai_error(404, f"no route {method} /v1/{'/'.join(route)}")

    def _files(
        self,
        store: Store,
        method: str,
        tail: list[str],
        *,
        query: dict[str, str],
        upload: tuple[Mapping[str, str], bytes],
        now: float,
    ) -> BatchReply | None:
        """The Files routes (``tail``: the path after ``files``); None: no such route."""
        if not tail and method == "POST":
            headers, body = upload
            return self._upload(store, headers.get("content-type", ""), body, now)
        if not tail and method == "GET":
            alive = [f for f in store.files.values() if not f.deleted]
            if "purpose" in query:
                alive = [f for f in alive if f.purpose == query["purpose"]]
            return 200, openai_list([f.object() for f in reversed(alive)], query), {}
        stored = store.files.get(tail[0])
        if stored is None or stored.deleted:
            return openai_error(404, f"No such File object: {tail[0]}", param="id")
        if tail[1:] == ["content"] and method == "GET":
            return 200, stored.data, {"Content-Type": "application/octet-stream"}
        if len(tail) == 1 and method == "GET":
            return 200, stored.object(), {}
        if len(tail) == 1 and method == "DELETE":
            stored.deleted = True
            store.counts["files_deleted"] += 1
            return 200, {"id": stored.id, "object": "file", "deleted": True}, {}
        return None

    def _batches(
        self,
        store: Store,
        method: str,
        tail: list[str],
        *,
        query: dict[str, str],
        body: bytes,
        now: float,
    ) -> BatchReply | None:
        """The Batch routes (``tail``: the path after ``batches``); None: no such route."""
        if not tail and method == "POST":
            return self._create_openai(store, body, now)
        if not tail and method == "GET":
            batches = [b for b in store.batches.values() if b.provider == OPENAI]
            objects = [self._openai_object(store, b, now) for b in reversed(batches)]
            return 200, openai_list(objects, query), {}
        batch = store.batches.get(tail[0])
        if batch is None or batch.provider != OPENAI:
            return openai_error(404, f"No batch found with id '{tail[0]}'.", param="id")
        if len(tail) == 1 and method == "GET":
            return 200, self._openai_object(store, batch, now), {}
        if tail[1:] == ["cancel"] and method == "POST":
            status = batch.status(now)
            if status not in ("validating", "in_progress"):
                return openai_error(400, f"Cannot cancel a batch with status '{status}'.")
            batch.cancel_at = now
            return 200, self._openai_object(store, batch, now), {}
        return None

    def _upload(self, store: Store, content_type: str, body: bytes, now: float) -> BatchReply:
        try:
            fields = form_fields(content_type, body)
        except ValueError as problem:
            return openai_error(400, str(problem))
        if "file" not in fields:
            return openai_error(400, "'file' is a required property", param="file")
        purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace")
        if purpose != "batch":
            return openai_error(400, f"the mock takes files for purpose 'batch', not {purpose!r}")
        filename, data = fields["file"]
        most_rows, most_bytes = store.settings.most(OPENAI)
        if len(data) > most_bytes:
            return openai_error(400, f"The file is {len(data)} bytes; at most {most_bytes}.")
        rows = openai_rows(store.key, data, store.settings)
        if isinstance(rows, str):
            return openai_error(400, rows)
        if len(rows) > most_rows:
            return openai_error(
                400, f"The batch input file has {len(rows)} requests; at most {most_rows}."
            )
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}", filename or "upload.jsonl", "batch", data, now, rows
        )
        store.files[stored.id] = stored
        store.counts["files_uploaded"] += 1
        return 200, stored.object(), {}

    def _create_openai(self, store: Store, body: bytes, now: float) -> BatchReply:
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        if not isinstance(request, dict):
            return openai_error(400, "the body must be a JSON object")
        file_id, endpoint = request.get("input_file_id"), request.get("endpoint")
        if request.get("completion_window") != "24h":
            return openai_error(400, "completion_window must be '24h'", param="completion_window")
        if endpoint not in OPENAI_URLS:
            return openai_error(
                400, f"endpoint must be one of {', '.join(OPENAI_URLS)}", param="endpoint"
            )
        stored = store.files.get(str(file_id))
        if stored is None or stored.deleted or stored.purpose != "batch":
            return openai_error(
                400, f"Invalid 'input_file_id': '{file_id}'.", param="input_file_id"
            )
        if not stored.rows:
            return openai_error(400, "The batch input file is empty.", param="input_file_id")
        if any(f"/{row.route}" != endpoint for row in stored.rows):
            return openai_error(
                400,
                f"The batch input file has rows whose url is not the endpoint {endpoint}.",
                param="endpoint",
            )
        metadata = request.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            return openai_error(400, "metadata must be an object", param="metadata")
        batch = self._new_batch(store, OPENAI, stored.rows, now)
        batch.endpoint, batch.input_file_id, batch.metadata = endpoint, stored.id, metadata
        batch.refused = self._over_cap(store, batch, now)
        store.counts["refused_creates"] += batch.refused
        store.batches[batch.id] = batch
        store.counts["batches_created"] += 1
        return 200, self._openai_object(store, batch, now), {}

    def _openai_object(self, store: Store, batch: Batch, now: float) -> dict[str, Any]:
        status = batch.status(now)
        self._finish(store, batch, now)
        ended = now >= batch.end
        errors = None
        if batch.refused:
            message = (
                f"Enqueued token limit reached for {batch.model} in organization org-mock. "
                f"Limit: {store.settings.enqueued:,} enqueued tokens. Please try again once some "
                "in_progress batches have been completed."
            )
            error = {"code": "token_limit_exceeded", "message": message, "param": None}
            errors = {"object": "list", "data": [{**error, "line": None}]}
        ran = batch.ran(now)
        finalizing = batch.started + batch.pace
        if batch.finished:
            counts = batch.final_counts
        else:
            answered = [self._row_answer(store, batch, k)[0] for k in self._done(batch, now)]
            good = sum(200 <= code < 300 for code in answered)
            counts = {"total": len(batch.rows), "completed": good, "failed": len(answered) - good}
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "model": batch.model,
            "errors": errors,
            "input_file_id": batch.input_file_id,
            "completion_window": "24h",
            "status": status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": unix(batch.created),
            "in_progress_at": unix(batch.started) if ran else None,
            "expires_at": unix(batch.created + DAY),
            "finalizing_at": (
                unix(finalizing) if ran and batch.cancel_at is None and now >= finalizing else None
            ),
            "completed_at": unix(batch.end) if status == "completed" else None,
            "failed_at": unix(batch.end) if status == "failed" else None,
            "expired_at": unix(batch.end) if status == EXPIRED else None,
            "cancelling_at": unix(batch.cancel_at),
            "cancelled_at": unix(batch.end) if status == CANCELLED and ended else None,
            "request_counts": counts,
            "metadata": batch.metadata,
        }

    # Anthropic

    def _anthropic(
        self,
        store: Store,
        method: str,
        route: list[str],
        *,
        query: dict[str, str],
        body: bytes,
        prefix: str,
    ) -> BatchReply:
        """The Message Batches routes (``route``: the path after ``v1/messages/batches``)."""
        now = time.time()
        if not route and method == "POST":
            return self._create_anthropic(store, body, now, prefix)
        if not route and method == "GET":
            batches = [b for b in store.batches.values() if b.provider == ANTHROPIC]
            objects = [
                self._anthropic_object(store, b, now, prefix)
                for b in reversed(batches)
                if not b.deleted
            ]
            return 200, anthropic_list(objects, query), {}
        batch = store.batches.get(route[0])
        if batch is None or batch.provider != ANTHROPIC or batch.deleted:
            return anthropic_error(
                404, f"No message batch with id {route[0]!r}.", "not_found_error"
            )
        reply = self._anthropic_batch(store, method, batch, route[1:], now=now, prefix=prefix)
        return reply or anthropic_error(
            404, f"no route {method} {'/'.join(route)}", "not_found_error"
        )

    def _anthropic_batch(
        self, store: Store, method: str, batch: Batch, action: list[str], *, now: float, prefix: str
    ) -> BatchReply | None:
        """The routes of one message batch (``action``: the path after its id); None: no such
        route."""
        ended = batch.status(now) == "ended"
        if not action and method == "GET":
            return 200, self._anthropic_object(store, batch, now, prefix), {}
        if not action and method == "DELETE":
            if not ended:
                return anthropic_error(
                    400, f"Batch {batch.id} cannot be deleted until it has ended; cancel it first."
                )
            batch.deleted = True
            store.counts["batches_deleted"] += 1
            return 200, {"id": batch.id, "type": "message_batch_deleted"}, {}
        if action == ["results"] and method == "GET":
            if not ended:
                return anthropic_error(
                    404, f"Batch {batch.id} has not ended: no results yet.", "not_found_error"
                )
            self._finish(store, batch, now)
            return 200, batch.results, {"Content-Type": "application/binary"}
        if action == ["cancel"] and method == "POST":
            if batch.status(now) != "in_progress":
                return anthropic_error(400, f"Batch {batch.id} is {batch.status(now)}.")
            batch.cancel_at = now
            return 200, self._anthropic_object(store, batch, now, prefix), {}
        return None

    def _create_anthropic(self, store: Store, body: bytes, now: float, prefix: str) -> BatchReply:
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        if not isinstance(request, dict) or not isinstance(request.get("requests"), list):
            return anthropic_error(400, "requests: Field required")
        most_rows, most_bytes = store.settings.most(ANTHROPIC)
        given: list[Any] = request["requests"]
        if not given:
            return anthropic_error(400, "requests: List should have at least 1 item")
        if len(given) > most_rows or len(body) > most_bytes:
            return anthropic_error(
                400,
                f"The batch has {len(given)} requests and {len(body)} bytes; at most "
                f"{most_rows} requests and {most_bytes} bytes.",
            )
        rows = anthropic_rows(store.key, given, store.settings)
        if isinstance(rows, str):
            return anthropic_error(400, rows)
        batch = self._new_batch(store, ANTHROPIC, rows, now)
        if self._over_cap(store, batch, now):
            store.counts["refused_creates"] += 1
            message = (
                f"Number of enqueued batch tokens would exceed the limit of "
                f"{store.settings.enqueued:,} for {batch.model}. Please wait for some batches to "
                "finish before submitting more."
            )
            status, payload, _ = anthropic_error(429, message, "rate_limit_error")
            return status, payload, {"retry-after": "1"}
        store.batches[batch.id] = batch
        store.counts["batches_created"] += 1
        return 200, self._anthropic_object(store, batch, now, prefix), {}

    def _anthropic_object(
        self, store: Store, batch: Batch, now: float, prefix: str
    ) -> dict[str, Any]:
        status = batch.status(now)
        self._finish(store, batch, now)
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        if batch.finished:
            counts.update(batch.final_counts)
        else:
            counts["processing"] = len(batch.rows)
        ended = status == "ended"
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "ended_at": rfc3339(batch.end) if ended else None,
            "created_at": rfc3339(batch.created),
            "expires_at": rfc3339(batch.created + DAY),
            "cancel_initiated_at": rfc3339(batch.cancel_at),
            "archived_at": None,
            "results_url": f"{prefix}/v1/messages/batches/{batch.id}/results" if ended else None,
        }

    # Both

    def _new_batch(self, store: Store, provider: str, rows: list[Row], now: float) -> Batch:
        ident = (
            f"batch_{uuid.uuid4().hex}" if provider == OPENAI else f"msgbatch_{uuid.uuid4().hex}"
        )
        return Batch(
            id=ident,
            provider=provider,
            rows=rows,
            created=now,
            pace=store.settings.pace,
            tokens=sum(row.tokens for row in rows),
            model=str(rows[0].body.get("model", "mock")),
        )

    @staticmethod
    def _over_cap(store: Store, batch: Batch, now: float) -> bool:
        """Whether the KEY's batches not yet ended and ``batch`` hold more than the cap."""
        cap = store.settings.enqueued
        held = sum(b.tokens for b in store.batches.values() if b.is_open(now))
        return bool(cap) and held + batch.tokens > cap

    @staticmethod
    def _done(batch: Batch, now: float) -> list[int]:
        return [k for k in range(len(batch.rows)) if batch.done(k, now)]

    def _row_answer(self, store: Store, batch: Batch, index: int) -> tuple[int, dict[str, Any]]:
        """Row ``index``'s status and body, made once: the live answer, or its fate's error."""
        if index not in batch.answers:
            row = batch.rows[index]
            if row.fate == "answer":
                status, answer, _ = unlimited_answer(row.route, row.body, store.key)
            elif batch.provider == ANTHROPIC:
                kind, status = (
                    ("api_error", 500) if row.fate == "500" else ("invalid_request_error", 400)
                )
                message = "The mock failed this request, as it was asked to."
                answer = {"type": "error", "error": {"type": kind, "message": message}}
            elif row.fate == "500":
                status, answer, _ = openai_error(
                    500,
                    "The server had an error while processing your request. Sorry about that!",
                    "server_error",
                )
            else:
                status, answer, _ = openai_error(
                    400, "The mock failed this request, as it was asked to."
                )
            batch.answers[index] = (status, answer)
        return batch.answers[index]

    def _finish(self, store: Store, batch: Batch, now: float) -> None:
        """Once a batch is over: its output and error files (OpenAI) or results (Anthropic)."""
        if batch.finished or now < batch.end or batch.refused:
            return
        batch.finished = True
        order = list(range(len(batch.rows)))
        if store.settings.shuffle:
            random.Random(batch.id).shuffle(order)
        if batch.provider == ANTHROPIC:
            self._finish_anthropic(store, batch, order)
            return
        output: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for index in order:
            row, outcome = batch.rows[index], batch.outcome(index)
            line: dict[str, Any] = {
                "id": f"batch_req_{uuid.uuid4().hex}",
                "custom_id": row.custom_id,
            }
            if outcome == "answered":
                status, answer = self._row_answer(store, batch, index)
                response = {
                    "status_code": status,
                    "request_id": f"req_{uuid.uuid4().hex}",
                    "body": answer,
                }
                output.append({**line, "response": response, "error": None})
                continue
            message = (
                "This request could not be executed before the completion window expired."
                if outcome == EXPIRED
                else "This request was not executed because the batch was cancelled."
            )
            error = {"code": f"batch_{outcome}", "message": message}
            errors.append({**line, "response": None, "error": error})
        good = sum(200 <= line["response"]["status_code"] < 300 for line in output)
        batch.final_counts = {
            "total": len(batch.rows),
            "completed": good,
            "failed": len(batch.rows) - good,
        }
        batch.output_file_id = self._output_file(store, batch, "output", output)
        batch.error_file_id = self._output_file(store, batch, "error", errors)

    def _finish_anthropic(self, store: Store, batch: Batch, order: list[int]) -> None:
        lines = []
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        for index in order:
            row, outcome = batch.rows[index], batch.outcome(index)
            result: dict[str, Any]
            if outcome == "answered":
                status, answer = self._row_answer(store, batch, index)
                result = (
                    {"type": "succeeded", "message": answer}
                    if status == 200
                    else {"type": "errored", "error": answer}
                )
            else:
                result = {"type": "expired" if outcome == EXPIRED else "canceled"}
            counts[result["type"]] += 1
            lines.append({"custom_id": row.custom_id, "result": result})
        batch.final_counts = counts
        batch.results = jsonl(lines)

    @staticmethod
    def _output_file(
        store: Store, batch: Batch, kind: str, lines: list[dict[str, Any]]
    ) -> str | None:
        if not lines:
            return None
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}",
            f"{batch.id}_{kind}.jsonl",
            "batch_output",
            jsonl(lines),
            batch.end,
        )
        store.files[stored.id] = stored
        return stored.id

    def _stats(self, store: Store, live: Mapping[str, int]) -> dict[str, Any]:
        now = time.time()
        with store.lock:
            for batch in store.batches.values():
                self._finish(store, batch, now)  # (the output files of the batches now over)
            ran = [b for b in store.batches.values() if b.ran(now)]
            seen: dict[str, list[tuple[str, str]]] = {}
            billed = dict.fromkeys(BILLED, 0)
            for batch in ran:
                for index, row in enumerate(batch.rows):
                    if batch.done(index, now):
                        status, answer = self._row_answer(store, batch, index)
                        if status < 500:  # (what the provider bills: not its own failures)
                            seen.setdefault(row.text, []).append((row.custom_id, batch.id))
                        usage = answer.get("usage") if status == 200 else None
                        for side, names in BILLED.items():
                            billed[side] += sum(int((usage or {}).get(n) or 0) for n in names)
            return {
                "billed": billed,
                "rows_answered": sum(len(runs) for runs in seen.values()),
                "both_lanes": sorted(text for text in seen if text in live),
                **store.counts,
                "files_alive": [f.id for f in store.files.values() if not f.deleted],
                "batches_run": len(ran),
                "rows_run": sum(len(b.rows) for b in ran),
                "twice": [
                    {"custom_ids": [c for c, _ in runs], "batches": [b for _, b in runs]}
                    for runs in seen.values()
                    if len(runs) > 1
                ],
                "auth": sorted(store.auth),
                "batches": [
                    {
                        "id": b.id,
                        "provider": b.provider,
                        "status": b.status(now),
                        "rows": len(b.rows),
                        "tokens": b.tokens,
                        "created_at": b.created,
                        "deleted": b.deleted,
                    }
                    for b in store.batches.values()
                ],
            }


def openai_rows(key: str, data: bytes, settings: Settings) -> list[Row] | str:
    """The rows of an OpenAI batch input file, or why it is not one."""
    rows: list[Row] = []
    seen: set[str] = set()
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            given = json.loads(line)
        except ValueError:
            return f"Line {number} of the batch input file is not valid JSON."
        if not isinstance(given, dict):
            return f"Line {number} of the batch input file is not a JSON object."
        custom_id, url, body = given.get("custom_id"), given.get("url"), given.get("body")
        if not isinstance(custom_id, str):
            return f"Line {number}: 'custom_id' must be a string."
        if custom_id in seen:
            return f"Line {number}: the custom_id {custom_id!r} is not unique in the file."
        if given.get("method") != "POST":
            return f"Line {number}: 'method' must be 'POST'."
        if url not in OPENAI_URLS:
            return f"Line {number}: 'url' must be one of {', '.join(OPENAI_URLS)}."
        if not isinstance(body, dict):
            return f"Line {number}: 'body' must be a JSON object."
        seen.add(custom_id)
        text, route = canonical(body), str(url).lstrip("/")
        fate = fate_of(key, custom_id, text, settings)
        rows.append(Row(custom_id, route, body, text, fate, row_tokens(route, body)))
    return rows


def anthropic_rows(key: str, given: list[Any], settings: Settings) -> list[Row] | str:
    """The rows of an Anthropic batch's ``requests``, or why they are not."""
    rows: list[Row] = []
    seen: set[str] = set()
    for number, request in enumerate(given):
        where = f"requests.{number}"
        if not isinstance(request, dict):
            return f"{where}: Input should be a valid dictionary"
        custom_id, params = request.get("custom_id"), request.get("params")
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            return f"{where}.custom_id: String should match pattern '{CUSTOM_ID.pattern}'"
        if custom_id in seen:
            return f"{where}.custom_id: Duplicate custom_id {custom_id!r} in the batch"
        if not isinstance(params, dict):
            return f"{where}.params: Field required"
        for name in ("model", "messages", "max_tokens"):
            if name not in params:
                return f"{where}.params.{name}: Field required"
        seen.add(custom_id)
        text = canonical(params)
        fate = fate_of(key, custom_id, text, settings)
        rows.append(
            Row(custom_id, "v1/messages", params, text, fate, row_tokens("v1/messages", params))
        )
    return rows


def limit_of(query: dict[str, str], most: int) -> int:
    """A page's ``limit``: 20 when not given (or not a number), between 1 and ``most``."""
    given = query.get("limit", "20")
    return max(1, min(int(given) if given.isdigit() else 20, most))


def openai_list(objects: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """OpenAI's cursor page of ``objects`` (newest first): ``limit`` of them ``after`` an id."""
    ids = [item["id"] for item in objects]
    start = ids.index(query["after"]) + 1 if query.get("after") in ids else 0
    limit = limit_of(query, 10_000)
    page = objects[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(objects),
    }


def anthropic_list(objects: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """Anthropic's page of ``objects`` (newest first): ``limit`` after ``after_id`` or before
    ``before_id``."""
    ids = [item["id"] for item in objects]
    limit = limit_of(query, 1000)
    if query.get("before_id") in ids:
        end = ids.index(query["before_id"])
        start = max(0, end - limit)
        page, more = objects[start:end], start > 0
    else:
        start = ids.index(query["after_id"]) + 1 if query.get("after_id") in ids else 0
        page, more = objects[start : start + limit], start + limit < len(objects)
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }
