"""A new provider is one module and one registry line: a third batch endpoint of another
shape (its own paths, ids, statuses, row format, millisecond times, results inline at a URL of
its own), written here as ``batches/openai.py`` and ``batches/anthropic.py`` are, registered,
and run end to end against a stdlib server of that shape: every row one Result in order, one
batch made, deleted once the rows are journaled, a create killed before its answer found again
by the batch's label, never made twice."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import SplitResult, parse_qs, urlsplit, urlunsplit

import pytest

from batchsync import Batch
from batchsync.batches.protocol import (
    Answer,
    Endpoint,
    Files,
    Start,
    custom_id,
    index_of,
    one_line,
    token_counts,
)
from batchsync.batches.providers import PROVIDERS, register
from batchsync.store.submissions import SHAPES, Part, Shape


class Jobs:
    """A provider whose rows go up inside the create, as ``{"key", "input"}`` items; its jobs
    are ``job-…``, ``queued``/``running``/``done``/``failed``, stamped in milliseconds, and
    carry the label they were made with (the part's nonce), by which a job is known."""

    name = "jobs"
    shape = Shape(
        statuses=("queued", "running", "done", "failed"),
        ended=frozenset({"done", "failed"}),
        id_forms={"batch": "job-"},
        uploads=False,
    )
    caps = (1000, 1_000_000)
    identifies_rows = True
    failed_status: str | None = "failed"
    working = frozenset({"running"})
    row_key = "key"

    def endpoint(self, url: SplitResult) -> Endpoint | None:
        path = url.path.rstrip("/")
        if not path.endswith("/v2/generate"):
            return None
        base = urlunsplit((url.scheme, url.netloc, path.removesuffix("/generate"), "", ""))
        return Endpoint(self.name, url.geturl(), base, "/v2/generate")

    def batches_url(self, endpoint: Endpoint) -> str:
        return f"{endpoint.base}/jobs"

    def describe_endpoints(self) -> str:
        return "end in /v2/generate"

    def request_line(
        self, endpoint: Endpoint, index: int, body: Mapping[str, Any], nonce: str
    ) -> bytes:
        return json.dumps({"key": custom_id(index, nonce), "input": body}).encode()

    def submission_size(self, lines: int, line_bytes: int) -> int:
        return line_bytes + lines + 32

    def create_body(
        self, endpoint: Endpoint, input_file: str | None, lines: Sequence[bytes], part: int
    ) -> bytes:
        label = json.loads(lines[0])["key"].partition("-")[0]
        items = [json.loads(line) for line in lines]
        return json.dumps({"label": label, "items": items}).encode()

    def status_of(self, batch: Mapping[str, Any]) -> str | None:
        state = batch.get("state")
        return state if isinstance(state, str) and state in self.shape.statuses else None

    def created_at(self, batch: Mapping[str, Any]) -> float | None:
        given = batch.get("submitted_ms")
        return given / 1000 if isinstance(given, int) and not isinstance(given, bool) else None

    def belongs_to(self, batch: Mapping[str, Any], part: Part) -> bool:
        return batch.get("label") == part.nonce and batch.get("size") == part.size

    def files_of(self, batch: Mapping[str, Any]) -> Files:
        url = batch.get("output")
        return Files(results_url=url if isinstance(url, str) else None)

    def results_urls(self, endpoint: Endpoint, batch: str, files: Files) -> list[str]:
        return [files.results_url or f"{self.batches_url(endpoint)}/{batch}/output"]

    def leftovers(self, endpoint: Endpoint, batch: str, found: Mapping[str, Any]) -> list[str]:
        return [f"{self.batches_url(endpoint)}/{batch}"]

    def create_url(self, endpoint: Endpoint) -> str:
        return self.batches_url(endpoint)

    # (its rows go up inside the create: no file is uploaded, listed or named)
    def upload_url(self, endpoint: Endpoint) -> str:
        raise NotImplementedError

    def upload_start(self, name: str, size: int) -> Start | None:
        raise NotImplementedError

    def upload_finish(self) -> dict[str, str]:
        raise NotImplementedError

    def file_id(self, file: Any) -> object:
        raise NotImplementedError

    def file_label(self, file: Mapping[str, Any]) -> object:
        raise NotImplementedError

    def file_params(self, cursor: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def files_listed(self, answer: Any) -> tuple[list[Mapping[str, Any]], bool, str | None]:
        raise NotImplementedError

    def batch_url(self, endpoint: Endpoint, batch: str) -> str:
        return f"{self.batches_url(endpoint)}/{batch}"

    def cancel_url(self, endpoint: Endpoint, batch: str) -> str:
        return f"{self.batch_url(endpoint, batch)}/cancel"

    def batch_id(self, batch: Mapping[str, Any]) -> object:
        return batch.get("id")

    def list_params(self, cursor: str | None) -> dict[str, Any]:
        return {"limit": 100} | ({} if cursor is None else {"page_after": cursor})

    def listed(self, answer: Any) -> tuple[list[Mapping[str, Any]], bool, str | None]:
        items = answer.get("items") if isinstance(answer, Mapping) else None
        page = [job for job in items if isinstance(job, Mapping)] if isinstance(items, list) else []
        last = page[-1].get("id") if page else None
        more = isinstance(answer, Mapping) and answer.get("more") is True
        return page, more, last if isinstance(last, str) else None

    def refused_for_tokens(self, batch: Mapping[str, Any]) -> bool:
        return False

    def failure_text(self, batch: Mapping[str, Any]) -> str:
        return one_line(batch.get("reason") or "the job failed")

    def answer_of(self, line: Any, nonce: str) -> Answer | None:
        if not isinstance(line, Mapping):
            return None
        index = index_of(line.get("key"), nonce)
        if index is None:
            return None
        if "output" in line:
            return Answer(index, True, 200, line["output"])
        error = line.get("error")
        code = error.get("code") if isinstance(error, Mapping) else None
        return Answer(index, False, code, None, "batch_errored", one_line(error))

    def usage_of(self, data: Any) -> tuple[int, int]:
        tokens = data.get("tokens") if isinstance(data, Mapping) else None
        return token_counts(tokens, ("in", "out"))


class _JobsServer(BaseHTTPRequestHandler):
    """The provider's side: jobs in memory, ``running`` 0.1 s after they are made and
    ``done`` 0.1 s later; each row answered with its input echoed. ``hold_create`` makes a
    job but answers its create that much later (so that a test kills the client then)."""

    jobs: ClassVar[dict[str, dict[str, Any]]] = {}
    creates: ClassVar[int] = 0
    deleted: ClassVar[list[str]] = []
    hold_create: ClassVar[float] = 0.0
    cursors: ClassVar[list[str]] = []  # (each page_after a list was asked from)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        cls.creates += 1
        job_id = f"job-{cls.creates:04d}"
        made = time.time()
        cls.jobs[job_id] = {"id": job_id, "label": body["label"], "items": body["items"]}
        cls.jobs[job_id]["made"] = made
        time.sleep(cls.hold_create)
        self._json(self._job(job_id))

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path.endswith("/jobs"):
            after = parse_qs(urlsplit(self.path).query).get("page_after", [None])[0]
            type(self).cursors.append(str(after))
            listed = sorted(self.jobs, reverse=True)
            if after in listed:
                listed = listed[listed.index(after) + 1 :]
            page = listed[:2]
            self._json({"items": [self._job(j) for j in page], "more": len(listed) > 2})
            return
        job_id = path.split("/")[-2 if path.endswith("/output") else -1]
        if job_id not in self.jobs:
            self._json({"error": "no such job"}, 404)
        elif path.endswith("/output"):
            lines = [
                {"key": item["key"], "output": {"echo": item["input"], "tokens": {"in": 1}}}
                for item in self.jobs[job_id]["items"]
            ]
            self._raw(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        else:
            self._json(self._job(job_id))

    def do_DELETE(self) -> None:
        job_id = urlsplit(self.path).path.split("/")[-1]
        type(self).deleted.append(job_id)
        self._json({"id": job_id, "deleted": True})

    def _job(self, job_id: str) -> dict[str, Any]:
        job = self.jobs[job_id]
        age = time.time() - job["made"]
        state = "queued" if age < 0.1 else "running" if age < 0.2 else "done"
        return {
            "id": job_id, "label": job["label"], "size": len(job["items"]), "state": state,
            "submitted_ms": int(job["made"] * 1000),
        }  # fmt: skip

    def _json(self, payload: object, status: int = 200) -> None:
        self._raw(json.dumps(payload).encode(), status)

    def _raw(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def jobs_provider() -> Iterator[str]:
    """The third provider registered (one line), and its server; both gone afterwards."""
    register(Jobs())
    _JobsServer.jobs, _JobsServer.creates, _JobsServer.deleted = {}, 0, []
    _JobsServer.cursors = []
    _JobsServer.hold_create = 0.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JobsServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v2/generate"
    finally:
        server.shutdown()
        server.server_close()
        PROVIDERS.pop("jobs")
        SHAPES.pop("jobs")


ROWS = [{"prompt": f"row {n}", "metadata": {"row": n}} for n in range(5)]


def test_a_third_provider_is_one_module_and_one_registry_line(
    jobs_provider: str, tmp_path: Path
) -> None:
    batch = Batch(
        ROWS, url=jobs_provider, batch_api="jobs", poll=0.05, progress=False,
        journal=tmp_path / "j.sqlite3",
    )  # fmt: skip
    results = batch.run()
    assert [r.index for r in results] == list(range(5))
    assert [r.id for r in results] == [{"row": n} for n in range(5)]
    assert [r.data["echo"] for r in results] == [{"prompt": f"row {n}"} for n in range(5)]
    assert _JobsServer.creates == 1
    assert _JobsServer.deleted == ["job-0001"], "deleted once its rows were journaled"


def test_the_third_providers_create_without_an_answer_is_found_by_its_label(
    jobs_provider: str, tmp_path: Path
) -> None:
    """A create whose answer does not come in time is looked for in the provider's list,
    paged by its own cursor past others' newer jobs, and taken by its label: never made
    twice."""
    now = time.time()
    for number in range(9001, 9006):  # (someone else's, listed before it)
        _JobsServer.jobs[f"job-{number}"] = {
            "id": f"job-{number}",
            "label": "0" * 12,
            "items": [{"key": "x"}] * 5,
            "made": now + 60,
        }
    _JobsServer.hold_create = 2.0
    batch = Batch(
        ROWS, url=jobs_provider, batch_api="jobs", poll=0.05, progress=False,
        journal=tmp_path / "j.sqlite3", timeout=0.5, attempts=1,
    )  # fmt: skip
    assert [r.ok for r in batch.run()] == [True] * 5
    assert _JobsServer.creates == 1, "the job the create made was found, not made again"
    assert _JobsServer.cursors[:3] == ["None", "job-9004", "job-9002"], "paged by its cursor"
