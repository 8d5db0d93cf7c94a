"""Pagination: which page follows which (pure decisions), and whole items followed page by
page against the mock server, counted from the server's side, resumed from the page that
failed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from batchsync import Backoff, Batch, fetch_all
from batchsync.http.paginate import (
    Continued,
    PagingError,
    first_position,
    gathered,
    links,
    next_page,
    paging,
    same_origin,
    with_param,
    with_userinfo,
)

from .mockserver import MockServerProcess

FAST = Backoff(base=0.01, max=0.02)


def follow(
    how: str,
    url: str,
    body: Any,
    link: str | None = None,
    *,
    records: bool = False,
    max_pages: int | None = None,
    number: int = 1,
    position: int | None = None,
) -> tuple[str, int] | None:
    """The next (url, position) after page ``number`` of an item whose first URL is ``url``."""
    chosen = paging(how, cursor_param="cursor", records="items" if records else None,
                    max_pages=max_pages)  # fmt: skip
    return next_page(
        chosen, first_url=url, url=url, number=number,
        position=first_position(chosen, url) if position is None else position,
        body=body, link=link,
    )  # fmt: skip


# -- pure decisions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "how", ["link", "json:meta.next", "page:page", "offset:offset,50", "json:next_cursor"]
)
def test_the_styles_are_read(how: str) -> None:
    style = how.partition(":")[0]
    assert paging(how, cursor_param="cursor", records=None, max_pages=None).style == style


@pytest.mark.parametrize(
    "how", ["links", "json", "json:", "page", "page:a,b", "offset:o", "offset:o,0", "offset:o,x",
            "json:[[["]
)  # fmt: skip
def test_an_unknown_style_is_one_clear_error(how: str) -> None:
    with pytest.raises(ValueError, match=r"paginate must be|JMESPath"):
        paging(how, cursor_param="cursor", records=None, max_pages=None)


def test_a_bad_records_path_is_refused() -> None:
    with pytest.raises(ValueError, match=r"page_items \(--items\): not a JMESPath"):
        paging("link", cursor_param="cursor", records="a[", max_pages=None)


def test_link_next_is_resolved_against_the_page() -> None:
    link = '<https://api.test/v1/x?page=1>; rel="prev", </v1/x?page=3>; rel="next last"'
    assert follow("link", "https://api.test/v1/x?page=2", None, link) == (
        "https://api.test/v1/x?page=3", 0,
    )  # fmt: skip
    assert follow("link", "https://api.test/v1/x", None, '<…>; rel="prev"') is None
    assert follow("link", "https://api.test/v1/x", None, None) is None


@pytest.mark.parametrize(
    ("header", "target"),
    [
        ('</p2>; title="a=b"; rel="next"', "/p2"),  # a parameter with = before rel
        ('</p2>; Rel="next"', "/p2"),  # parameter names are case-insensitive
        ("</p2>; REL=NEXT", "/p2"),
        ('</p?a=1;b=2>; rel="next"', "/p?a=1;b=2"),  # a ; inside the target
        ('</p1>; rel="prev", </p3>; rel="next"', "/p3"),
        ('</p1>; title="x, y"; rel="prev", </p3>; rel=next', "/p3"),  # a , in a quoted value
        ('</p3>; rel="last next"', "/p3"),
        ('</p2>; title="a \\"q\\""; rel="next"', "/p2"),  # an escaped quote
    ],
)
def test_link_headers_are_read_as_rfc_8288_writes_them(header: str, target: str) -> None:
    assert follow("link", "https://api.test/x", None, header) == (f"https://api.test{target}", 0)


def test_an_unreadable_link_header_names_no_next_page() -> None:
    assert list(links("garbage")) == []
    assert [target for target, _ in links('</a>; rel="prev" junk </b>; rel="next"')] == ["/a"]


def test_json_path_gives_a_url_or_a_cursor() -> None:
    first = "https://api.test/v1/x?limit=5&cursor=old"
    assert follow("json:next", first, {"next": "/v1/x?after=9"}) == (
        "https://api.test/v1/x?after=9", 0,
    )  # fmt: skip
    # a cursor replaces the one the URL had, other parameters kept as written
    assert follow("json:next", first, {"next": "b64+/="}) == (
        "https://api.test/v1/x?limit=5&cursor=b64%2B%2F%3D", 0,
    )  # fmt: skip
    for done in ({"next": None}, {"next": ""}, {}, [1, 2]):
        assert follow("json:next", first, done) is None
    assert follow("json:next", first, {"next": 42}) == (
        "https://api.test/v1/x?limit=5&cursor=42", 0,
    )  # fmt: skip
    # upper-case schemes and bare queries are URLs, not cursors
    assert follow("json:next", first, {"next": "HTTPS://api.test/v1/y"}) == (
        "https://api.test/v1/y", 0,
    )  # fmt: skip
    assert follow("json:next", first, {"next": "?page=2"}) == ("https://api.test/v1/x?page=2", 0)
    for wrong in (True, [1], {"a": 1}):
        with pytest.raises(PagingError, match="is not a URL or cursor"):
            follow("json:next", first, {"next": wrong})


def test_page_and_offset_count_until_an_empty_page() -> None:
    url = "https://api.test/x?q=a%20b&page=4"
    assert follow("page:page", url, [1]) == ("https://api.test/x?q=a%20b&page=5", 5)
    assert follow("page:page", url, []) is None
    assert follow("offset:offset,25", "https://api.test/x", [1], position=50) == (
        "https://api.test/x?offset=75", 75,
    )  # fmt: skip
    assert follow("offset:o,10", "https://api.test/x", {"items": []}, records=True) is None
    assert follow("offset:o,10", "https://api.test/x", {"items": [1]}, records=True) == (
        "https://api.test/x?o=10", 10,
    )  # fmt: skip


def test_an_object_page_without_a_records_path_cannot_be_counted() -> None:
    """{"items": []} is an empty page only if one knows where the records are: without
    page_items it would be fetched forever, so the item fails instead."""
    with pytest.raises(PagingError, match="page_items"):
        follow("page:page", "https://api.test/x", {"items": []})


def test_max_pages_ends_the_item() -> None:
    assert follow("page:page", "https://api.test/x?page=2", [1], number=3, max_pages=3) is None


def test_the_first_position_is_the_urls_own() -> None:
    chosen = paging("page:p", cursor_param="c", records=None, max_pages=None)
    assert first_position(chosen, "https://a.test/x?p=7") == 7
    assert first_position(chosen, "https://a.test/x") == 1
    offset = paging("offset:o,5", cursor_param="c", records=None, max_pages=None)
    assert first_position(offset, "https://a.test/x?o=x") == 0
    assert first_position(chosen, "https://a.test/x?p=%C2%B2") == 1  # a digit, not an ASCII one


def test_gathered_pages_or_records() -> None:
    whole = paging("link", cursor_param="c", records=None, max_pages=None)
    assert gathered(whole, [{"a": 1}], {"a": 2}, first=False) == [{"a": 1}, {"a": 2}]
    flat = paging("link", cursor_param="c", records="data.items", max_pages=None)
    assert gathered(flat, [1], {"data": {"items": [2, 3]}}, first=False) == [1, 2, 3]
    assert gathered(flat, [1], {"data": {}}, first=False) == [1]
    assert gathered(flat, [1], {"data": {"items": 4}}, first=False) == [1, 4]
    # a path that finds nothing on the first page is a wrong path, not an empty collection
    with pytest.raises(PagingError, match=r"the first page has nothing at data\.items"):
        gathered(flat, [], {"items": [1]}, first=True)


@pytest.mark.parametrize(
    ("url", "same"),
    [
        ("http://127.0.0.1:81/p2", True),
        ("HTTP://127.0.0.1:81/p2", True),
        ("http://u:p@127.0.0.1:81/p2", True),
        ("http://127.0.0.1:82/p2", False),
        ("https://127.0.0.1:81/p2", False),
        ("http://localhost:81/p2", False),
        # read as :82 by urllib3 (which sends it), as :81 by the standard library
        ("http://127.0.0.1:82\\@127.0.0.1:81/p2", False),
        ("http://127.0.0.1:81\\@127.0.0.1:82/p2", False),
        ("http://[::1]:81/p2", False),
        ("http://127.0.0.1:99999/p2", False),
    ],
)
def test_same_origin_as_both_parsers_read_it(url: str, same: bool) -> None:
    assert same_origin(url, "http://127.0.0.1:81/p1") is same


def test_a_full_next_url_keeps_the_items_credentials() -> None:
    first = "http://user:pw@api.test/x"
    assert with_userinfo("http://api.test/x?page=2", first) == "http://user:pw@api.test/x?page=2"
    assert with_userinfo("http://other:o@api.test/x", first) == "http://other:o@api.test/x"
    assert with_userinfo("http://api.test/x", "http://api.test/y") == "http://api.test/x"


def test_with_param_keeps_the_rest_of_the_query_as_written() -> None:
    assert with_param("https://a.test/x?b=%7E&page=1&c", "page", "2") == (
        "https://a.test/x?b=%7E&c&page=2"
    )
    assert with_param("https://a.test/x#frag", "p", "a b") == "https://a.test/x?p=a+b#frag"


# -- whole items against the mock server ---------------------------------------------------


def pages_requested(server: MockServerProcess, tag: str) -> list[int]:
    return [entry["page"] for entry in server.log(f"tag={tag}") if "page" in entry]


@pytest.mark.parametrize(
    ("style", "how"),
    [("link", "link"), ("cursor", "json:next"), ("next", "json:next"), ("page", "page:page"),
     ("offset", "offset:offset,3")],
)  # fmt: skip
def test_every_page_is_fetched_once_in_order(
    fresh_server: MockServerProcess, style: str, how: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{fresh_server.url}/pages/{style}?total=10&size=3&tag={tag}"
    # a plain URL (the fast lane) and a mapping with params (prepared by requests)
    items: list[Any] = [url, {"url": url.replace(f"tag={tag}", ""), "params": {"tag": tag}}]
    results = fetch_all(items, paginate=how, page_items="items", progress=False)
    expected_pages = 5 if style in ("page", "offset") else 4  # (the empty page ends them)
    for result in results:
        assert result.ok, result.error
        assert [record["n"] for record in result.data] == list(range(10))
        assert result.pages == expected_pages
        assert result.attempts == expected_pages
        assert result.to_dict()["pages"] == expected_pages
    # (the two items run at once: their pages interleave)
    assert sorted(pages_requested(fresh_server, tag)) == sorted([*range(1, expected_pages + 1)] * 2)


def test_without_page_items_the_data_is_the_list_of_pages(fresh_server: MockServerProcess) -> None:
    url = f"{fresh_server.url}/pages/link?total=5&size=2"
    (result,) = fetch_all([url], paginate="link", progress=False)
    assert [page["page"] for page in result.data] == [1, 2, 3]
    assert result.data[2]["items"] == [{"n": 4}]


def test_max_pages_stops_early(fresh_server: MockServerProcess) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{fresh_server.url}/pages/page?total=100&size=3&tag={tag}"
    (result,) = fetch_all([url], paginate="page:page", page_items="items", max_pages=2,
                          progress=False)  # fmt: skip
    assert result.ok and result.pages == 2 and len(result.data) == 6
    assert pages_requested(fresh_server, tag) == [1, 2]


def test_each_page_is_retried_on_its_own(fresh_server: MockServerProcess) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{fresh_server.url}/pages/page?total=9&size=3&fail=2&fail_times=2&tag={tag}"
    (result,) = fetch_all([url], paginate="page:page", page_items="items", attempts=3,
                          backoff=FAST, progress=False)  # fmt: skip
    assert result.ok and result.pages == 4
    assert [record.status_code for record in result.attempt_log] == [200, 503, 503, 200, 200, 200]
    assert pages_requested(fresh_server, tag) == [1, 2, 2, 2, 3, 4]


def test_a_failed_page_keeps_the_pages_before_it(fresh_server: MockServerProcess) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{fresh_server.url}/pages/page?total=9&size=3&fail=3&tag={tag}"
    (result,) = fetch_all([url], paginate="page:page", page_items="items", attempts=2,
                          backoff=FAST, progress=False)  # fmt: skip
    assert not result.ok and result.error_kind == "status" and result.status_code == 503
    assert result.pages == 2 and [record["n"] for record in result.data] == list(range(6))
    assert result.error is not None
    assert result.error.startswith(f"page 3 ({url}&page=3): HTTP 503 after 2 attempts")
    assert pages_requested(fresh_server, tag) == [1, 2, 3, 3]


def test_a_first_page_that_fails_is_an_ordinary_failure(fresh_server: MockServerProcess) -> None:
    url = f"{fresh_server.url}/pages/page?total=9&size=3&fail=1"
    (result,) = fetch_all([url], paginate="page:page", page_items="items", attempts=1,
                          progress=False)  # fmt: skip
    assert not result.ok and result.pages == 0 and result.continuation is None
    assert result.error == "HTTP 503 after 1 attempt"


def test_all_pages_share_the_items_budget(fresh_server: MockServerProcess) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{fresh_server.url}/pages/page?total=300&size=3&delay=0.2&tag={tag}"
    (result,) = fetch_all([url], paginate="page:page", page_items="items", budget=1.0,
                          progress=False)  # fmt: skip
    assert not result.ok and result.error_kind == "budget"
    assert (
        result.pages is not None and 1 <= result.pages < 6
    )  # 0.2 s a page: no more than 5 fit in the second
    assert len(result.data) == 3 * result.pages
    assert result.continuation is not None


def test_a_next_page_on_another_origin_is_not_followed(fresh_server: MockServerProcess) -> None:
    """The item's headers (its token) go only where the item said."""
    elsewhere = fresh_server.url.replace("127.0.0.1", "localhost")
    url = f"{fresh_server.url}/pages/next?total=9&size=3&base={elsewhere}"
    (result,) = fetch_all([url], paginate="json:next", page_items="items", progress=False,
                          headers={"Authorization": "Bearer tkn-9f3e"})  # fmt: skip
    assert not result.ok and result.error_kind == "invalid_body"
    assert result.error is not None and "another origin" in result.error
    assert result.pages == 1 and len(result.data) == 3
    assert [entry["host"] for entry in fresh_server.log("/pages/next")] == [
        fresh_server.url.removeprefix("http://")
    ]


def test_an_object_page_needs_page_items(fresh_server: MockServerProcess) -> None:
    url = f"{fresh_server.url}/pages/page?total=9&size=3"
    (result,) = fetch_all([url], paginate="page:page", progress=False)
    assert not result.ok and result.error_kind == "invalid_body"
    assert result.error == (
        "after page 1: a page is an object: say where its records are (page_items / --items)"
    )
    assert result.attempts == 1  # the refusal sends nothing


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"paginate": "pages"}, "paginate must be"),
        ({"page_items": "items"}, "need paginate"),
        ({"paginate": "json:next", "expect": "text"}, "expect='json'"),
        ({"paginate": "link", "max_pages": 0}, "max_pages"),
    ],
)
def test_bad_options_are_one_value_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fetch_all(["http://127.0.0.1:9/x"], progress=False, **options)


# -- the command line: resume from the page that failed ------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args], check=False, cwd=cwd, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


def test_an_endless_collection_stops_at_max_bytes_in_total(
    fresh_server: MockServerProcess,
) -> None:
    # 256 KiB pages and a cursor that never ends: memory stays bounded, the item ends at once
    url = f"{fresh_server.url}/endless-pages?kb=256"
    started = time.monotonic()
    (result,) = fetch_all([url], paginate="json:next", page_items="items", max_bytes=2**20,
                          budget=6, progress=False)  # fmt: skip
    assert not result.ok and result.error_kind == "invalid_body", result.error
    assert result.error is not None and "over max_bytes" in result.error
    assert [record["n"] for record in result.data] == [0, 1, 2]  # the pages within the bound
    assert result.pages == 4 and result.continuation is None  # finished: a resume is done
    assert time.monotonic() - started < 5


def test_a_resumed_item_counts_the_pages_before_it() -> None:
    data = [{"n": 0, "pad": "x" * 1000}]
    page = Continued.of("http://h.test/", {"url": "http://h.test/?p=2", "page": 2, "position": 0},
                        data).page  # fmt: skip
    assert page.data == data and page.size > 1000


def test_resume_goes_on_from_the_failed_page(
    fresh_server: MockServerProcess, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    key = "cnry-" + uuid.uuid4().hex
    base = f"{fresh_server.url}/pages"
    lines = [
        f"{base}/page?total=10&size=3&fail=3&fail_times=1&tag={tag}&api_key={key}",
        f"{base}/page?total=4&size=2&tag={tag}",
        json.dumps({"url": f"{base}/page?total=7&size=3&fail=2&fail_times=1&tag={tag}", "id": "c"}),
    ]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    options = ["in.txt", "--items", "items", "--attempts", "1", "-o", "out", "-q"]
    first = run_cli("--paginate", "page:page", *options, cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    records = [json.loads(line) for line in (tmp_path / "out-results.jsonl").open()]
    assert [(r["ok"], r["pages"]) for r in records] == [(False, 2), (True, 3), (False, 1)]
    assert key not in (tmp_path / "out-results.jsonl").read_text()
    assert records[0]["error"].startswith("page 3 (") and "api_key=***" in records[0]["error"]

    second = run_cli("--paginate", "page:page", *options, "--resume", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    records = [json.loads(line) for line in (tmp_path / "out-results.jsonl").open()]
    assert [(r["ok"], r["pages"]) for r in records] == [(True, 5), (True, 3), (True, 4)]
    assert [[n["n"] for n in r["data"]] for r in records] == [
        list(range(10)), list(range(4)), list(range(7)),
    ]  # fmt: skip
    log = fresh_server.log(f"tag={tag}")
    first_item = [entry["page"] for entry in log if "total=10" in entry["target"]]
    assert first_item == [1, 2, 3, 3, 4, 5]  # pages 1 and 2 were not fetched again
    # the page it went on from carried the real key (the journal kept it, the outputs not)
    assert (
        f"api_key={key}" in [entry for entry in log if "total=10" in entry["target"]][3]["target"]
    )
    third_item = [entry["page"] for entry in log if "total=7" in entry["target"]]
    assert third_item == [1, 2, 2, 3, 4]
    for name in ("out-results.jsonl", "out-failed.jsonl"):
        assert key not in (tmp_path / name).read_text()


def test_cli_options_are_checked(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("http://127.0.0.1:9/x\n")
    done = run_cli("in.txt", "--paginate", "sideways", "-o", "out", cwd=tmp_path)
    assert done.returncode == 2
    assert "paginate must be link, json:PATH, page:PARAM or offset:PARAM,STEP" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out-results.jsonl").exists()


def test_a_batch_goes_on_from_the_failed_page(
    fresh_server: MockServerProcess, tmp_path: Path
) -> None:
    """``run()`` again, and a new Batch over the same journal, fetch only the pages left."""
    tag = uuid.uuid4().hex[:8]
    base = f"{fresh_server.url}/pages/page?size=3&fail_times=1&tag={tag}"
    items = [f"{base}&total=9&fail=2", f"{base}&total=9&fail=3"]
    options: dict[str, Any] = {"paginate": "page:page", "page_items": "items", "attempts": 1,
                               "progress": False}  # fmt: skip
    batch = Batch(items, journal=tmp_path / "j.sqlite3", **options)
    first = batch.run()
    assert [(r.ok, r.pages) for r in first] == [(False, 1), (False, 2)]
    assert batch.pending == 2
    again = Batch(items, journal=tmp_path / "j.sqlite3", **options)  # a new session
    assert again.pending == 2
    second = again.run()
    assert [(r.ok, r.pages, len(r.data)) for r in second] == [(True, 4, 9), (True, 4, 9)]
    assert again.pending == 0
    assert sorted(pages_requested(fresh_server, tag)) == [1, 1, 2, 2, 2, 3, 3, 3, 4, 4]


def test_a_templated_batch_goes_on_from_the_failed_page(
    fresh_server: MockServerProcess, tmp_path: Path
) -> None:
    """Rows, a URL template and pages: the row is expanded again for the pages left."""
    tag = uuid.uuid4().hex[:8]
    template = (
        f"{fresh_server.url}/pages/page?size=3&fail_times=1&tag={tag}{{id}}&total={{n}}&fail=2"
    )
    rows = [{"n": 9, "id": "a"}, {"n": 3, "id": "b"}]
    options: dict[str, Any] = {"url": template, "paginate": "page:page", "page_items": "items",
                               "attempts": 1, "progress": False}  # fmt: skip
    batch = Batch(rows, **options)
    assert [(r.ok, r.pages, r.id) for r in batch.run()] == [(False, 1, "a"), (False, 1, "b")]
    assert [(r.ok, r.pages, len(r.data)) for r in batch.run()] == [(True, 4, 9), (True, 2, 3)]


def test_a_next_page_the_parsers_read_differently_is_not_followed(
    fresh_server: MockServerProcess,
) -> None:
    """urllib3 would send ``http://127.0.0.1:9\\@127.0.0.1:PORT/…`` to port 9, the standard
    library reads PORT: such a page is taken as another origin."""
    here = fresh_server.url.removeprefix("http://")
    url = f"{fresh_server.url}/pages/next?total=9&size=3&base=http://127.0.0.1:9%5C@{here}"
    (result,) = fetch_all([url], paginate="json:next", page_items="items", progress=False)
    assert result.error_kind == "invalid_body" and result.pages == 1
    assert result.error is not None and result.error.endswith("another origin; not followed")


def test_pages_that_go_round_in_a_loop_fail_the_item(fresh_server: MockServerProcess) -> None:
    """A cursor sent where the API does not look for it brings page 1 back, again and again."""
    url = f"{fresh_server.url}/pages/cursor?total=9&size=3"
    (result,) = fetch_all([url], paginate="json:next", cursor_param="after", page_items="items",
                          progress=False)  # fmt: skip
    assert result.error_kind == "invalid_body" and result.pages == 2
    assert result.error is not None and result.error.startswith("page 3 (")
    assert result.error.endswith("fetched already: the pages go round in a loop")


def test_a_wrong_items_path_fails_rather_than_finding_nothing(
    fresh_server: MockServerProcess,
) -> None:
    url = f"{fresh_server.url}/pages/page?total=9&size=3"
    (result,) = fetch_all([url], paginate="page:page", page_items="itemz", progress=False)
    assert not result.ok and result.error == "after page 1: the first page has nothing at itemz"


def test_fallback_urls_are_paginated_too(fresh_server: MockServerProcess) -> None:
    tag = uuid.uuid4().hex[:8]
    item = {"url": f"{fresh_server.url}/503/x",
            "fallbacks": [f"{fresh_server.url}/pages/link?total=7&size=3&tag={tag}"]}  # fmt: skip
    (result,) = fetch_all([item], paginate="link", page_items="items", attempts=1,
                          progress=False)  # fmt: skip
    assert result.ok and result.fallback_used == 0 and result.pages == 3
    assert [record["n"] for record in result.data] == list(range(7))
    assert pages_requested(fresh_server, tag) == [1, 2, 3]


@pytest.mark.parametrize(
    "other",
    [[], ["--paginate", "link", "--items", "items"], ["--paginate", "page:page"],
     ["--paginate", "page:page", "--items", "items", "--cursor-param", "c"]],
)  # fmt: skip
def test_resume_with_other_pagination_is_refused(
    fresh_server: MockServerProcess, tmp_path: Path, other: list[str]
) -> None:
    """Pages read another way would be mixed with the pages before (or lost)."""
    url = f"{fresh_server.url}/pages/page?total=9&size=3&fail=2&tag={uuid.uuid4().hex[:8]}"
    (tmp_path / "in.txt").write_text(url + "\n")
    first = run_cli("in.txt", "--paginate", "page:page", "--items", "items", "--attempts", "1",
                    "-o", "out", "-q", cwd=tmp_path)  # fmt: skip
    assert first.returncode == 1, first.stderr
    before = (tmp_path / "out-results.jsonl").read_bytes()
    again = run_cli("in.txt", *other, "-o", "out", "-q", "--resume", cwd=tmp_path)
    assert again.returncode == 2
    assert "its pagination options were different" in again.stderr
    assert "Traceback" not in again.stderr
    assert (tmp_path / "out-results.jsonl").read_bytes() == before


def test_a_batch_journal_made_with_other_pagination_is_refused(
    fresh_server: MockServerProcess, tmp_path: Path
) -> None:
    url = f"{fresh_server.url}/pages/page?total=9&size=3"
    Batch([url], journal=tmp_path / "j.sqlite3", paginate="page:page", page_items="items",
          progress=False).run()  # fmt: skip
    with pytest.raises(ValueError, match="its pagination options were different"):
        Batch([url], journal=tmp_path / "j.sqlite3", progress=False)


def test_ctrl_c_mid_pagination_then_resume_fetches_each_page_once(
    fresh_server: MockServerProcess, tmp_path: Path
) -> None:
    """Stopped between pages, the item is kept with its pages so far; --resume goes on from
    the next one and the data holds every record once."""
    tag = uuid.uuid4().hex[:8]
    url = f"{fresh_server.url}/pages/page?total=30&size=3&delay=0.3&tag={tag}"
    (tmp_path / "in.txt").write_text(url + "\n")
    options = ["in.txt", "--paginate", "page:page", "--items", "items", "-o", "out", "-q"]
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsync", *options], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while len(pages_requested(fresh_server, tag)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    stopped_at = len(pages_requested(fresh_server, tag))
    assert stopped_at < 11  # (11 pages in all: 10 with records, then the empty one)
    (record,) = [json.loads(line) for line in (tmp_path / "out-results.jsonl").open()]
    assert record["error_kind"] == "cancelled" and record["pages"] >= 2

    again = run_cli(*options, "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "out-results.jsonl").open()]
    assert record["ok"] and record["pages"] == 11
    assert [n["n"] for n in record["data"]] == list(range(30))
    assert pages_requested(fresh_server, tag) == list(range(1, 12))  # each page once
