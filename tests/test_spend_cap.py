"""A spend cap that holds by construction (issue 43): against the mock LLM API, which bills
each answer by the usage it reports, the server's own sum never goes over ``max_cost``,
whatever the mix of ``max_tokens`` and concurrency, across a run killed and resumed, and
with its journal tampered; and a run uses most of the cap when its input could spend more."""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
import threading
import urllib.error
import uuid
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from batchsync import Batch, ResultSet, fetch_all
from batchsync.contrib.redis import RedisLimits
from batchsync.core.admission import PICO
from batchsync.store.journal import JournalUnusable
from batchsync.store.journal.spend import SpendRecord

from .mockserver import MockServerProcess
from .services import redis_server
from .test_cli import batchsync as run_cli
from .test_cli import read_jsonl
from .test_durability import start_cli, wait_until
from .test_journal_tamper import Case, apply, cases
from .test_llm_batches import prefix

pytestmark = pytest.mark.integration

INPUT, OUTPUT = Fraction("2.5"), Fraction(10)  # dollars a million tokens
PRICES = {"models": {"gpt-mock": {"input": "2.5", "output": "10"}}}


def chats(url: str, draw: random.Random, count: int) -> list[dict[str, Any]]:
    """Chat requests of random prompt sizes and ``max_tokens`` (the mock answers with a draw
    between 1 and ``max_tokens`` tokens)."""
    return [
        {"url": url, "method": "POST", "id": n, "json": {
            "model": "gpt-mock", "max_tokens": draw.randint(1, 400),
            "messages": [{"role": "user", "content": "word " * draw.randint(1, 300)}]}}
        for n in range(count)
    ]  # fmt: skip


def admitted(server: MockServerProcess, key: str) -> int:
    """The requests the server admitted for ``key`` so far (0 before its first)."""
    try:
        return int(server.get(f"/llm/{key}/stats")["requests"])
    except urllib.error.HTTPError:
        return 0


def billed(server: MockServerProcess, key: str) -> Fraction:
    """What the server billed, in dollars, by the usage its answers reported."""
    counted = server.get(f"/llm/{key}/stats")
    tokens = counted["prompt_tokens"] * INPUT + counted["completion_tokens"] * OUTPUT
    return Fraction(tokens, 10**6)


@pytest.mark.parametrize("seed", range(6))
def test_the_server_never_bills_more_than_the_cap_and_the_run_uses_most_of_it(
    server: MockServerProcess, seed: int
) -> None:
    draw = random.Random(seed)
    base, key = prefix(server, f"rpm=1000000,tpm=100000000,latency={draw.choice([0, 0.02])}")
    items = chats(f"{base}/v1/chat/completions", draw, 200)  # (about $0.3 billed in all)
    cap = Fraction(draw.choice(["0.1", "0.15", "0.2"]))
    concurrency = draw.choice([1, 8, 32, 64])
    rs = fetch_all(items, concurrency=concurrency, max_cost=str(float(cap)), prices=PRICES)
    spent = billed(server, key)
    assert spent <= cap, (float(spent), concurrency)
    assert spent >= Fraction(9, 10) * cap, (float(spent), concurrency, rs.summary())
    assert [r.index for r in rs] == list(range(200))
    assert {r.error_kind for r in rs if not r.ok} == {"cost"}, rs.summary()
    assert abs(sum(r.cost or 0 for r in rs) - float(spent)) < 1e-9
    summary = rs.summary()
    assert summary.spent == pytest.approx(float(spent), abs=1e-9)
    assert f"spent ${summary.spent:.6f}" in str(summary)
    assert all(r.attempts == 0 and r.cost is None for r in rs if not r.ok)


def test_a_run_killed_then_resumed_stays_under_the_cap(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """The attempts in flight at the kill were reserved in the journal before they were sent:
    the resumed run counts them at their worst case, whatever the server billed."""
    base, key = prefix(server, "rpm=1000000,tpm=100000000,latency=0.2")
    draw = random.Random(11)
    rows = [item["json"] for item in chats("", draw, 300)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "prices.json").write_text(json.dumps(PRICES))
    command = ["rows.jsonl", "--url", f"{base}/v1/chat/completions", "--method", "POST",
               "--row-as-body", "-c", "16", "--max-cost", "0.2", "--prices", "prices.json",
               "--no-progress"]  # fmt: skip
    process = start_cli(*command, cwd=tmp_path)
    wait_until(lambda: admitted(server, key) >= 40)
    process.kill()
    process.wait(timeout=10)
    with contextlib.closing(SpendRecord(tmp_path / "rows-journal.sqlite3")) as record:
        assert record.total() > 0
    resumed = run_cli(*command, "--resume", cwd=tmp_path)
    assert resumed.returncode == 1, resumed.stderr  # (the items the cap could not pay for)
    results = read_jsonl(tmp_path / "rows-results.jsonl")
    assert [r["index"] for r in results] == list(range(300))
    assert {r["error_kind"] for r in results if not r["ok"]} == {"cost"}
    assert "spent $" in resumed.stderr
    counted = Fraction(spent_in(tmp_path / "rows-journal.sqlite3"), PICO)
    assert billed(server, key) <= counted <= Fraction("0.2")


@pytest.fixture(scope="module")
def capped_journal(
    server: MockServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, Any]]]:
    """The journal of a finished run under a cap, and its items."""
    base, _ = prefix(server, "rpm=1000000,tpm=100000000")
    items = chats(f"{base}/v1/chat/completions", random.Random(5), 12)
    path = tmp_path_factory.mktemp("capped") / "journal.sqlite3"
    Batch(items, journal=path, max_cost="0.05", prices=PRICES).run()
    return path, items


def spent_in(path: Path) -> int:
    with contextlib.closing(SpendRecord(path)) as record:
        return record.total()


def tampered_copies(source: Path, table: str, folder: Path) -> Iterator[tuple[Case, Path]]:
    """Each tampering of ``table`` (``test_journal_tamper.cases``) applied to a copy of the
    journal ``source`` in ``folder``: the case and the copy (one that cannot be applied left
    out)."""
    for number, case in enumerate(cases(source, table)):
        path = folder / f"{number}.sqlite3"
        shutil.copy(source, path)
        if apply(path, case):
            yield case, path


def test_a_tampered_spend_table_never_counts_less_than_was_spent(
    capped_journal: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Every value of every row of ``spend`` altered, the table dropped, a row copied or
    deleted: the run is refused in one line, or it counts no less than was spent."""
    source, items = capped_journal
    spent = spent_in(source)
    assert spent > 0
    checked = 0
    for case, path in tampered_copies(source, "spend", tmp_path):
        checked += 1
        try:
            Batch(items, journal=path, max_cost="0.05", prices=PRICES)
        except JournalUnusable as refused:
            assert "\n" not in str(refused) and "spend" in str(refused), (case, refused)
            continue
        assert spent_in(path) >= spent, Case.__str__(case)
    assert checked > 20


def test_processes_sharing_redis_share_one_cap(server: MockServerProcess) -> None:
    """Two clients at once, each half the items, their ledger kept by Redis: the server bills
    no more than the one cap, and most of it."""
    base, key = prefix(server, "rpm=1000000,tpm=100000000")
    items = chats(f"{base}/v1/chat/completions", random.Random(3), 200)
    quota = f"spend-{uuid.uuid4().hex[:8]}"
    with redis_server() as url:
        halves = [items[::2], items[1::2]]
        done: list[ResultSet] = []
        workers = [
            threading.Thread(target=lambda half=half: done.append(fetch_all(
                half, concurrency=16, limits=url, namespace=quota, max_cost="0.15",
                prices=PRICES)))
            for half in halves
        ]  # fmt: skip
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        spent = billed(server, key)
        assert Fraction("0.135") <= spent <= Fraction("0.15"), float(spent)
        assert abs(sum(r.cost or 0 for rs in done for r in rs) - float(spent)) < 1e-9


def test_a_journal_run_again_with_redis_counts_what_it_spent_before(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """A Redis ledger of a namespace new to the journal (or a server that lost its data)
    starts from what the journal says was spent, not from nothing."""
    base, key = prefix(server, "rpm=1000000,tpm=100000000")
    items = chats(f"{base}/v1/chat/completions", random.Random(9), 60)
    journal = tmp_path / "journal.sqlite3"
    Batch(items, journal=journal, max_cost="0.05", prices=PRICES).run()
    with redis_server() as url:
        again = Batch(items, journal=journal, max_cost="0.05", prices=PRICES, limits=url,
                      namespace=f"again-{uuid.uuid4().hex[:8]}")  # fmt: skip
        again.run(retry_failed=True)
    assert billed(server, key) <= Fraction("0.05")


def test_a_reservation_of_a_process_that_died_counts_as_spent() -> None:
    """A reservation older than any attempt can last was made by a process that died before
    it could settle it: the ledger counts it spent, at its worst case, for good."""
    with redis_server() as url:
        limits = RedisLimits(url, namespace=f"dead-{uuid.uuid4().hex[:8]}")
        ledger = limits.ledger(10 * PICO)
        mark = ledger.reserve(4 * PICO)
        assert mark
        held = limits.key("spend", "held")
        (name,) = limits.redis.hkeys(held)
        limits.redis.hset(held, name, f"{4 * PICO // 1000} 1.5")  # (made long ago)
        assert ledger.reserve(7 * PICO) is False  # (the 4 are spent: 7 never fits)
        assert ledger.spent == 4 * PICO
        ledger.settle(mark, 4 * PICO, 1 * PICO)  # (its process, back after all: too late)
        assert ledger.spent == 4 * PICO
        assert ledger.reserve(6 * PICO)


def test_a_cap_that_cannot_be_kept_whole_is_refused_in_one_line(
    server: MockServerProcess, tmp_path: Path
) -> None:
    base, _ = prefix(server, "-")
    item = [{"url": f"{base}/v1/chat/completions", "method": "POST", "json": {}}]
    for options, said in [
        ({"max_cost": "1"}, "max_cost (--max-cost) and prices (--prices) go together"),
        ({"max_cost": "-1", "prices": PRICES}, "max_cost must be an amount of dollars"),
        ({"max_cost": "1", "prices": PRICES, "hedge_after": 0.1},
         "max_cost (--max-cost) cannot reserve the second copy hedge_after"),
        ({"max_cost": "1", "prices": {"models": {"m": {"input": "x", "output": 1}}}},
         "prices: models.m.input: "),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(said)) as raised:
            fetch_all(item, **options)  # type: ignore[arg-type]
        assert "\n" not in str(raised.value).strip()
    (tmp_path / "rows.jsonl").write_text("{}\n")
    (tmp_path / "prices.json").write_text(json.dumps(PRICES))
    url = f"{base}/v1/chat/completions"
    refused = run_cli("rows.jsonl", "--url", url, "--row-as-body", "--batch-api",
                      "--max-cost", "1", "--prices", "prices.json", cwd=tmp_path)  # fmt: skip
    assert refused.returncode == 2 and "max_cost" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    bad = run_cli("rows.jsonl", "--url", url, "--row-as-body",
                  "--max-cost", "1", "--prices", "missing.json", cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "cannot read 'missing.json'" in bad.stderr, bad.stderr


def test_what_cannot_be_priced_ends_cost_unsent_and_an_error_bills_nothing(
    server: MockServerProcess,
) -> None:
    """A model the table does not price, no max_tokens, an image: each ends ``cost`` with
    nothing sent. A 429 (the mock's, over its limit: its headers left unread, so that two
    requests go at once) costs nothing; its retry is billed."""
    base, key = prefix(server, "rpm=1,tpm=100000000,window=1,retry_after=1")
    url = f"{base}/v1/chat/completions"
    message = [{"role": "user", "content": "hello"}]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    bodies = [
        {"model": "gpt-mock", "max_tokens": 5, "messages": message},
        {"model": "gpt-mock", "max_tokens": 5, "messages": message},
        {"model": "gpt-other", "max_tokens": 5, "messages": message},
        {"model": "gpt-mock", "messages": message},
        {"model": "gpt-mock", "max_tokens": 5, "messages": image},
    ]
    items = [{"url": url, "method": "POST", "json": body} for body in bodies]
    options = {"max_cost": "1", "prices": PRICES, "attempts": 4, "budget": 30}
    rs = fetch_all(items, concurrency=2, quota_headers=False, **options)  # type: ignore[arg-type]
    assert [r.ok for r in rs] == [True, True, False, False, False], rs.summary()
    assert [r.error_kind for r in rs[2:]] == ["cost"] * 3
    assert "no price for model 'gpt-other'" in (rs[2].error or "")
    assert all(r.attempts == 0 for r in rs[2:])
    refused = [entry for r in rs[:2] for entry in r.attempt_log if entry.status_code == 429]
    assert refused and all(entry.cost == 0 for entry in refused)
    assert abs(sum(r.cost or 0 for r in rs) - float(billed(server, key))) < 1e-12
    assert PICO == 10**12


def test_the_report_draws_what_a_capped_run_spent_from_memory_and_from_its_journal(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """The spend chart adds up each attempt's cost as it ended: to what the Results say they
    spent, read from the Results in memory (``fetch_all``) and from the command's journal; a
    run without a cap draws none."""
    from batchsync.output import report_data
    from batchsync.output.resultset import StoredResults
    from batchsync.store.journal import JournalReader

    pytest.importorskip("plotly")
    base, key = prefix(server, "rpm=1000000,tpm=100000000")
    items = chats(f"{base}/v1/chat/completions", random.Random(5), 40)
    rs = fetch_all(items, max_cost="0.03", prices=PRICES)
    spent = rs.summary().spent
    assert spent is not None and 0 < spent <= 0.03 and not all(r.ok for r in rs)
    memory, _ = report_data.collected(*report_data.entries_of(list(rs)))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(i["json"]) + "\n" for i in items))
    (tmp_path / "prices.json").write_text(json.dumps(PRICES))
    done = run_cli("rows.jsonl", "--url", f"{base}/v1/chat/completions", "--method", "POST",
                   "--row-as-body", "--max-cost", "0.03", "--prices", "prices.json",
                   "--no-progress", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr  # (the rows the cap could not pay for)
    journal = tmp_path / "rows-journal.sqlite3"
    reader = JournalReader(journal)
    try:
        stored_results = StoredResults(reader, journal)
        kept, _ = report_data.collected(stored_results.entries(), stored_results.span)
    finally:
        reader.close()
    stored = sum(r.get("cost") or 0 for r in read_jsonl(tmp_path / "rows-results.jsonl"))
    assert spent + stored == pytest.approx(float(billed(server, key)), abs=1e-9)  # (both runs)
    for tally, total in ((memory, spent), (kept, stored)):
        in_all = tally.spending()["in all"]
        assert in_all[-1] == pytest.approx(total, abs=1e-9) and in_all == sorted(in_all)
        # (each answer reserved its worst case, no less than it spent: one model, by name)
        [(model, attempts, reserved, by_model)] = tally.spending_by_model()
        assert model == "gpt-mock" and attempts >= 1 and by_model == pytest.approx(total)
        assert sum(tally.spending()["reserved"]) == pytest.approx(reserved)
        assert reserved > by_model
    command_page = (tmp_path / "rows-report.html").read_text()
    assert "chart-spend" in command_page and "spend-by-model" in command_page
    page = rs.report(tmp_path / "r.html").read_text()
    assert "chart-spend" in page and page.count("Plotly.newPlot") == 6
    assert "<td>gpt-mock</td>" in page
    plain = fetch_all(items[:2]).report(tmp_path / "plain.html").read_text()
    assert "chart-spend" not in plain and plain.count("Plotly.newPlot") == 5
    assert "spend-by-model" not in plain
