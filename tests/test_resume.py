"""What a run has left to send (pure decisions); then one resume, every way in (issue 27):
the same runs, journaled then resumed (or their failures retried), through ``Batch``
(``CallBatch`` for calls), the command line, the command line on a Dask cluster, and
``fetch_on_cluster`` (``run_on_cluster``) give the same Results and send the same requests.
Where a way in has no such run, the case is skipped, saying why."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from batchsync import Batch, CallBatch
from batchsync.core.history import DONE, TO_FINISH, TO_GO_ON, TO_REDO, TO_SEND, Pass
from batchsync.core.result import Result
from batchsync.http.paginate import Continued
from batchsync.store.resume import Items, Left

from .mockserver import MockServerProcess

FAILED = {"ok": False, "error_kind": "status"}
PASS_2 = Pass().retrying(["status"])


@pytest.mark.parametrize(
    ("current", "made_in", "result", "continued", "does"),
    [
        (Pass(),  1, {"ok": True, "error_kind": None},        False, DONE),
        (Pass(),  1, FAILED,                                   False, DONE),
        (Pass(),  1, FAILED,                                   True,  TO_GO_ON),
        (Pass(),  1, {"ok": False, "error_kind": "cancelled"}, True,  TO_FINISH),
        (PASS_2,  1, FAILED,                                   False, TO_REDO),
        (PASS_2,  1, FAILED,                                   True,  TO_GO_ON),
        (PASS_2,  1, {"ok": False, "error_kind": "timeout"},   True,  DONE),
        (PASS_2,  2, FAILED,                                   True,  DONE),
        (PASS_2,  1, {"ok": True, "error_kind": None},        False, DONE),
    ],
)  # fmt: skip
def test_what_a_pass_does_with_an_item(
    current: Pass, made_in: int, result: dict[str, Any], continued: bool, does: int
) -> None:
    """The first pass's resume goes on with what failed partway; a retry sends again, or
    goes on with, only the failures of its kinds made in the passes before it."""
    assert current.does(result["ok"], result["error_kind"], made_in, continued) == does


def test_what_is_left_is_sent_in_the_runners_form_adding_to_what_each_had() -> None:
    went = {"url": "http://h.test/?page=2", "page": 2, "position": 0}
    stored = {
        2: Result(2, "http://h.test/c", False, attempts=1, error_kind="status"),
        3: Result(3, "http://h.test/?page=1", False, attempts=2, data=[1], continuation=went),
        4: Result(4, "http://h.test/e", False, attempts=2, data=[1], continuation=went),
    }
    marks = bytearray([DONE, TO_SEND, TO_REDO, TO_GO_ON, TO_FINISH])
    urls = ["http://h.test/a", "http://h.test/b", "http://h.test/c", "http://h.test/?page=1",
            "http://other.test/e"]  # fmt: skip
    left = Left(marks, Items(), stored.get)
    assert left.count == 4
    sent = list(left.sent(enumerate(urls)))
    assert [index for index, _ in sent] == [1, 2, 3, 4]
    assert sent[2][1] == Continued.of(urls[3], went, [1])  # from its next page
    assert sent[3][1] == urls[4]  # a next page off the item's origin: from its first
    assert [left.taken(index) for index in range(5)] == [None, None, stored[2], stored[3], None]
    assert left.taken(2) is None  # (given once)


RUNNERS = ("batch", "cli", "cli-dask", "cluster")
PAGED = {"paginate": "page:page", "page_items": "items", "attempts": 1}
PAGED_FLAGS = ["--paginate", "page:page", "--items", "items", "--attempts", "1"]


@dataclass(frozen=True)
class Case:
    """A run made twice over one journal: first, then resumed (``retry``: its failures sent
    again instead), with what each way in must give after each run and the requests each
    item got from the server in all (``requests``, read back by ``sent``)."""

    items: list[Any]
    options: dict[str, Any]
    flags: list[str]
    first: list[tuple[Any, ...]]
    second: list[tuple[Any, ...]]
    requests: list[Any]
    sent: Callable[[MockServerProcess], list[Any]]
    template: str | None = None  # the rows' URL template
    calls: Callable[[Any], Any] | None = None  # the function called for each item
    lost: int | None = None  # the item whose journaled Result a crash lost between the runs
    retry: bool = False
    # Why a way in has no such run, by runner.
    missing: dict[str, str] = field(default_factory=dict)


def per_item(server: MockServerProcess, tag: str, count: int) -> list[int]:
    """The requests each of ``count`` items tagged ``tag-N`` got."""
    paths = [entry["target"].split("?")[0] for entry in server.log(tag)]
    return [sum(1 for path in paths if path.endswith(f"-{n}")) for n in range(count)]


def pages(server: MockServerProcess, tag: str) -> list[Any]:
    """The pages requested of each collection tagged ``tag``, by collection."""
    asked: dict[str, list[int]] = {}
    for entry in server.log(f"tag={tag}"):
        collection = entry["target"].split(f"tag={tag}")[1].split("&")[0]
        asked.setdefault(collection, []).append(entry["page"])
    return sorted(asked.values())


def plain(server: MockServerProcess, tag: str) -> Case:
    """Three items, the second's Result lost by a crash: only it is sent again."""
    urls = [f"{server.url}/ok/{tag}-0", f"{server.url}/ok/{tag}-1", f"{server.url}/404/{tag}-2"]
    done = [(True, None, 200, 1, None, True), (True, None, 200, 1, None, True)]
    failed = (False, "status", 404, 1, None, None)
    return Case(
        urls, {"attempts": 1}, ["--attempts", "1"], [*done, failed], [*done, failed], [1, 2, 1],
        lambda s: per_item(s, tag, 3), lost=1,
    )  # fmt: skip


def paginated(server: MockServerProcess, tag: str) -> Case:
    """A collection whose page 2 failed: the resume goes on from page 2."""
    url = f"{server.url}/pages/page?size=3&total=9&fail=2&fail_times=1&tag={tag}"
    return Case(
        [url], PAGED, PAGED_FLAGS,
        first=[(False, "status", 503, 2, 1, [0, 1, 2])],
        second=[(True, None, 200, 5, 4, list(range(9)))],
        requests=[[1, 2, 2, 3, 4]], sent=lambda s: pages(s, tag),
    )  # fmt: skip


def templated(server: MockServerProcess, tag: str) -> Case:
    """Table rows through a URL template, each a collection whose page 2 failed."""
    template = f"{server.url}/pages/page?size=3&fail_times=1&tag={tag}{{id}}&total={{n}}&fail=2"
    return Case(
        [{"id": "a", "n": 9}, {"id": "b", "n": 3}], PAGED, PAGED_FLAGS,
        first=[(False, "status", 503, 2, 1, [0, 1, 2])] * 2,
        second=[(True, None, 200, 5, 4, list(range(9))), (True, None, 200, 3, 2, [0, 1, 2])],
        requests=[[1, 2, 2], [1, 2, 2, 3, 4]], sent=lambda s: pages(s, tag), template=template,
        missing={"cluster": "fetch_on_cluster takes no URL template: its items are requests"},
    )  # fmt: skip


def callables(server: MockServerProcess, tag: str) -> Case:
    """A function called for three items, the second's Result lost by a crash."""
    base = server.url  # (what the function closes over is pickled to a cluster's workers)

    def status(n: int) -> int:
        return requests.get(f"{base}/ok/{tag}-{n}", timeout=5).status_code

    done = [(True, None, None, 1, None, 200)] * 3
    no_calls = "the command line sends HTTP requests: it calls no function"
    return Case(
        [0, 1, 2], {"attempts": 1}, [], done, done, [1, 2, 1], lambda s: per_item(s, tag, 3),
        calls=status, lost=1, missing={"cli": no_calls, "cli-dask": no_calls},
    )  # fmt: skip


def retried(server: MockServerProcess, tag: str) -> Case:
    """A failure sent again in a new pass, counting its first attempt too."""
    urls = [f"{server.url}/503-then-ok/{tag}/x-0?after=1", f"{server.url}/ok/{tag}-1"]
    return Case(
        urls, {"attempts": 1}, ["--attempts", "1"],
        first=[(False, "status", 503, 1, None, None), (True, None, 200, 1, None, True)],
        second=[(True, None, 200, 2, None, True), (True, None, 200, 1, None, True)],
        requests=[2, 1], sent=lambda s: per_item(s, tag, 2), retry=True,
        missing={"cluster": "fetch_on_cluster retries no failures: its journal keeps one pass"},
    )  # fmt: skip


CASES = {
    "plain": plain,
    "paginated-partial": paginated,
    "templated": templated,
    "callables": callables,
    "retry-failed": retried,
}


def outcome(record: dict[str, Any]) -> tuple[Any, ...]:
    """What a case compares of a Result: its outcome, attempts, pages and data (records by
    their ``n``, the mock server's answer by its ``ok``)."""
    data = record["data"]
    if isinstance(data, list):
        data = [entry["n"] for entry in data]
    elif isinstance(data, dict):
        data = data.get("ok")
    fields = ("ok", "error_kind", "status_code", "attempts")
    return (*(record[name] for name in fields), record.get("pages"), data)


def in_library(case: Case, folder: Path, again: bool) -> list[dict[str, Any]]:
    journal = folder / "journal.sqlite3"
    options = {"journal": journal, "progress": False, **case.options}
    if case.calls is not None:
        batch: Batch | CallBatch = CallBatch(case.calls, case.items, **options)
    else:
        batch = Batch(case.items, url=case.template, **options)
    return [r.to_dict() for r in batch.run(retry_failed=again and case.retry)]


def on_cluster(case: Case, folder: Path, again: bool, client: Any) -> list[dict[str, Any]]:
    from batchsync.run.cluster import fetch_on_cluster, run_on_cluster

    journal = folder / "journal.sqlite3"
    options = {"journal": journal, "partition_size": 1, **case.options}
    if case.calls is not None:
        results = run_on_cluster(case.calls, case.items, client, **options)
    else:
        results = fetch_on_cluster(case.items, client, **options)
    return [r.to_dict() for r in results]


def on_command_line(
    case: Case, folder: Path, again: bool, dask: str | None
) -> list[dict[str, Any]]:
    if case.template is None:
        source = folder / "items.txt"
        source.write_text("".join(f"{item}\n" for item in case.items))
    else:
        source = folder / "rows.json"
        source.write_text(json.dumps(case.items))
    args = [source.name, "-o", "out", "--no-progress", *case.flags]
    args += [] if case.template is None else ["--url", case.template]
    args += [] if dask is None else ["--dask", dask, "--partition-size", "1"]
    args += ["--retry-failed" if case.retry else "--resume"] if again else []
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", *args], cwd=folder, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in (folder / "out-results.jsonl").open()]


def journal_of(runner: str, folder: Path) -> Path:
    name = "out-journal.sqlite3" if runner.startswith("cli") else "journal.sqlite3"
    return folder / name


def lose(journal: Path, index: int) -> None:
    """What a crash leaves: the journal without the Result of item ``index``."""
    with sqlite3.connect(journal) as db:
        assert db.execute("DELETE FROM results WHERE idx = ?", (index,)).rowcount == 1
    db.close()


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("runner", RUNNERS)
def test_every_way_in_resumes_a_run_alike(
    runner: str, name: str, server: MockServerProcess, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    case = CASES[name](server, uuid.uuid4().hex[:8])
    if runner in case.missing:
        pytest.skip(case.missing[runner])
    client = request.getfixturevalue("cluster") if "dask" in runner or runner == "cluster" else None

    def run(again: bool) -> list[dict[str, Any]]:
        if runner == "batch":
            return in_library(case, tmp_path, again)
        if runner == "cluster":
            return on_cluster(case, tmp_path, again, client)
        address = None if client is None else client.scheduler.address
        return on_command_line(case, tmp_path, again, address)

    assert [outcome(record) for record in run(again=False)] == case.first
    if case.lost is not None:
        lose(journal_of(runner, tmp_path), case.lost)
    assert [outcome(record) for record in run(again=True)] == case.second
    assert case.sent(server) == case.requests
