"""The spend cap through a provider's batch endpoint (issue 43): each part reserved at the
batch price before it is submitted, journaled with the part, and settled by whichever run
reads its answers. Against the mock of both batch APIs, which bills every row it answers by
the usage it reports: the server's own sum never goes over ``max_cost``, across both lanes,
a kill and a resume, and the run uses most of the cap when its rows could spend more."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sqlite3
import uuid
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from batchsync import Batch
from batchsync.store.journal import JournalUnusable

from .hostile_batch import HostileProvider
from .mockserver import MockServerProcess
from .test_batch_api import (
    KEY_HEADER,
    PROVIDERS,
    command,
    counts_so_far,
    endpoint,
    parts,
    results,
    run,
    start,
    stats,
    wait_for,
)
from .test_batch_hostile import CREATE, DOWNLOAD, POLL
from .test_journal_tamper import Case
from .test_spend_cap import billed as billed_live
from .test_spend_cap import spent_in, tampered_copies

pytestmark = pytest.mark.integration

INPUT, OUTPUT, FACTOR = Fraction("2.5"), Fraction(10), Fraction(1, 2)
PRICES = {"models": {"gpt-mock": {"input": "2.5", "output": "10"}}, "batch": "0.5"}
HEADERS = {
    "openai": KEY_HEADER,
    "anthropic": {"x-api-key": "sk-ant-canary-9Zk", "anthropic-version": "2023-06-01"},
}


def chat_rows(draw: random.Random, count: int) -> list[dict[str, Any]]:
    """Rows of random prompt sizes and ``max_tokens`` (the mock answers with a draw between 1
    and ``max_tokens`` tokens), each a request body (less its ``metadata``) or ``BODY``'s
    fields."""
    return [
        {"model": "gpt-mock", "max_tokens": draw.randint(1, 400), "metadata": {"row": n},
         "messages": [{"role": "user", "content": "word " * draw.randint(1, 300)}]}
        for n in range(count)
    ]  # fmt: skip


def short_rows(count: int) -> list[dict[str, Any]]:
    """Request bodies of a few words each (none alike) and 400 ``max_tokens``: the answers'
    output dwarfs the prompts."""
    return [
        {"model": "gpt-mock", "max_tokens": 400, "metadata": {"row": n},
         "messages": [{"role": "user", "content": f"word {n}"}]}
        for n in range(count)
    ]  # fmt: skip


def billed_batches(server: MockServerProcess, key: str) -> Fraction:
    """What the server billed for the KEY's batch rows, in dollars, at the batch price."""
    tokens = stats(server, key)["billed"]
    full = tokens["input_tokens"] * INPUT + tokens["output_tokens"] * OUTPUT
    return Fraction(full, 10**6) * FACTOR


def billed(server: MockServerProcess, key: str) -> Fraction:
    """Both lanes: the batch rows at the batch price, the live answers at the full one."""
    try:
        live = billed_live(server, key)
    except OSError:  # (no live request yet)
        live = Fraction(0)
    return billed_batches(server, key) + live


# The body both lanes send of each row (one template: one journal for both lanes).
BODY = {"model": "gpt-mock", "max_tokens": "{max_tokens}", "messages": "{messages}"}


@pytest.mark.parametrize("seed", range(4))
def test_both_lanes_and_a_resume_never_bill_more_than_the_cap(
    server: MockServerProcess, tmp_path: Path, seed: int
) -> None:
    """A random mix of rows through the batch endpoint (OpenAI's or Anthropic's, parts of
    random size), some runs stopped after a few answers and resumed, then what the cap could
    not pay for sent again live on the same journal: the server's sum stays under the cap,
    and the batch lane alone uses most of it."""
    draw = random.Random(seed)
    provider = draw.choice(["openai", "anthropic"])
    url, key = endpoint(server, provider, "pace=0.1,rpm=1000000,tpm=100000000")
    rows = chat_rows(draw, 150)
    cap = Fraction(draw.choice(["0.02", "0.03", "0.05"]))
    same: dict[str, Any] = {
        "url": url, "method": "POST", "body": BODY, "journal": tmp_path / "j.sqlite3",
        "progress": False, "headers": HEADERS[provider], "max_cost": str(float(cap)),
        "prices": PRICES,
    }  # fmt: skip
    lane: dict[str, Any] = {
        "batch_api": "auto",
        "poll": 0.05,
        "batch_rows": draw.choice([10, 40, 200]),
    }
    if draw.random() < 0.5:  # (stopped after its first answers, resumed by a new Batch)
        seen: list[int] = []
        stop_after = draw.randint(1, 20)

        def stop(result: Any) -> None:
            seen.append(result.index)
            if len(seen) == stop_after:
                raise KeyboardInterrupt

        with contextlib.suppress(KeyboardInterrupt):
            Batch(rows, on_result=stop, **same, **lane).run()
    done = Batch(rows, **same, **lane).run()
    assert [r.index for r in done] == list(range(150))
    spent_batch = billed_batches(server, key)
    assert spent_batch <= cap, (float(spent_batch), provider)
    assert spent_batch >= Fraction(9, 10) * cap, (float(spent_batch), done.summary())
    assert {r.error_kind for r in done if not r.ok} <= {"cost"}, done.summary()
    assert stats(server, key)["twice"] == []
    paid = sum(Fraction(r.cost or 0) for r in done)
    assert paid <= Fraction(spent_in(same["journal"]), 10**12) + Fraction(1, 10**9)  # (floats)

    live = Batch(rows, concurrency=draw.choice([1, 16, 64]), **same)
    again = live.run(retry_failed=["cost"])
    assert [r.index for r in again] == list(range(150))
    assert billed(server, key) <= cap, float(billed(server, key))


def test_a_cap_with_room_for_only_some_rows_sends_the_rest_once_answers_settle(
    server: MockServerProcess,
) -> None:
    """Rows whose worst cases do not all fit wait for the parts in flight, then go in new
    parts as their answers settle for less: more parts than the rows need, every row answered,
    and the server's sum under the cap."""
    url, key = endpoint(server, "openai", "pace=0.1")
    rows = short_rows(40)
    # Each row's worst case: about 100 bytes at $1.25 and 400 tokens at $5 a million, ~$0.0021;
    # the mock answers with half the allowance on average: the 40 rows bill about $0.04.
    done = Batch(
        rows, url=url, batch_api="openai", poll=0.05, progress=False, headers=KEY_HEADER,
        max_cost="0.06", prices=PRICES,
    ).run()  # fmt: skip
    spent = billed_batches(server, key)
    assert spent <= Fraction("0.06")
    counts = stats(server, key)
    assert counts["batches_created"] > 1, "the rows the cap could not hold went in later parts"
    assert Counter(r.ok for r in done) == {True: 40}, done.summary()
    assert counts["twice"] == []


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_part_read_by_two_runs_is_settled_at_what_its_rows_used(
    server: MockServerProcess, tmp_path: Path, provider: str
) -> None:
    """A run stopped while it reads a part's answers, and a new run that reads the rest:
    the part is settled at what every row used (the first run's rows by their journaled
    Results), not at the worst case of those the second run did not read."""
    url, key = endpoint(server, provider, "pace=0.1")
    rows = chat_rows(random.Random(4), 30)
    same: dict[str, Any] = {
        "url": url, "method": "POST", "body": BODY, "journal": tmp_path / "j.sqlite3",
        "progress": False, "headers": HEADERS[provider], "max_cost": "1", "prices": PRICES,
        "batch_api": "auto", "poll": 0.05,
    }  # fmt: skip
    seen: list[int] = []

    def stop_after_five(result: Any) -> None:
        seen.append(result.index)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Batch(rows, on_result=stop_after_five, **same).run()
    done = Batch(rows, **same).run()
    assert all(r.ok for r in done) and stats(server, key)["batches_created"] == 1
    counted = spent_in(same["journal"])
    billed_pico = billed_batches(server, key) * 10**12
    assert billed_pico <= counted <= billed_pico + 30, "each row at what it used (+1 pico)"


def test_a_price_table_without_the_batch_factor_is_refused_in_one_line(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9/v1/chat/completions"
    with pytest.raises(ValueError, match="batch endpoint's factor") as refused:
        Batch([{"model": "gpt-mock"}], url=url, batch_api="openai", max_cost="1",
              prices={"models": PRICES["models"]})  # fmt: skip
    assert "\n" not in str(refused.value)
    (tmp_path / "in.jsonl").write_text('{"model": "gpt-mock", "max_tokens": 5}\n')
    (tmp_path / "prices.json").write_text(json.dumps({"models": PRICES["models"]}))
    args = command(tmp_path / "in.jsonl", url, "openai", "--batch-api", "--max-cost", "1",
                   "--prices", "prices.json")  # fmt: skip
    done = run(args, tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "batch" in done.stderr and "Traceback" not in done.stderr


def test_a_row_the_table_cannot_price_ends_cost_unsent(server: MockServerProcess) -> None:
    url, key = endpoint(server, "openai", "pace=0.1")
    rows: list[dict[str, Any]] = [
        {"model": "gpt-mock", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}]},
        {"model": "unpriced", "max_tokens": 5, "messages": [{"role": "user", "content": "b"}]},
        {"model": "gpt-mock", "messages": [{"role": "user", "content": "no max_tokens"}]},
    ]
    done = Batch(rows, url=url, batch_api="openai", poll=0.05, progress=False,
                 headers=KEY_HEADER, max_cost="1", prices=PRICES).run()  # fmt: skip
    assert [(r.ok, r.error_kind, r.attempts) for r in done] == [
        (True, None, 1),
        (False, "cost", 0),
        (False, "cost", 0),
    ]
    assert "unpriced" in (done[1].error or "") and "max_tokens" in (done[2].error or "")
    assert stats(server, key)["rows_run"] == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_killed_while_its_parts_run_the_resumed_run_settles_them_under_the_cap(
    server: MockServerProcess, tmp_path: Path, provider: str
) -> None:
    """The parts in flight at the kill were reserved in the journal with the parts: the
    resumed run counts them at their worst case until it reads their answers, then at what
    they used, and sends the rest within what is left."""
    url, key = endpoint(server, provider, "pace=0.2")
    draw = random.Random(3)
    rows = chat_rows(draw, 60)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "prices.json").write_text(json.dumps(PRICES))
    more = ["--batch-api", "--poll", "0.05", "--batch-rows", "10", "--max-cost", "0.02"]
    args = command(tmp_path / "in.jsonl", url, provider, *more, "--prices", "prices.json")
    journal = tmp_path / "in-journal.sqlite3"
    first = start(args, tmp_path)
    wait_for(lambda: any(b for _, b in parts(journal)), first, "submitted")
    first.send_signal(signal.SIGKILL)
    first.wait()
    with contextlib.closing(sqlite3.connect(journal)) as db:
        charged = db.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
    assert charged >= 1, "each part submitted holds its charge"

    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode in (0, 1), resumed.stderr
    written = results(tmp_path / "in-results.jsonl")
    assert [row["index"] for row in written] == list(range(60))
    assert {row["error_kind"] for row in written if not row["ok"]} <= {"cost"}
    spent = billed_batches(server, key)
    assert spent <= Fraction("0.02")
    assert spent >= Fraction("0.018"), float(spent)
    assert stats(server, key)["twice"] == []
    assert Fraction(spent_in(journal), 10**12) >= spent, "the journal counts what was billed"
    with contextlib.closing(sqlite3.connect(journal)) as db:
        assert db.execute("SELECT COUNT(*) FROM charges").fetchone()[0] == 0, "all settled"


@pytest.fixture(scope="module")
def held_journal(
    server: MockServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """A journal whose two parts were still running when the deadline ended the run (their
    charges unsettled), its rows and the Batch's arguments."""
    url, _ = endpoint(server, "openai", "pace=0.5")
    rows = chat_rows(random.Random(9), 10)
    arguments: dict[str, Any] = {
        "url": url, "batch_api": "openai", "poll": 0.05, "progress": False,
        "headers": KEY_HEADER, "max_cost": "0.05", "prices": PRICES, "batch_rows": 5,
    }  # fmt: skip
    path = tmp_path_factory.mktemp("held") / "journal.sqlite3"
    ran = Batch(rows, journal=path, deadline=0.3, **arguments).run()
    assert {r.error_kind for r in ran} == {"deadline"}
    return path, rows, arguments


def test_a_tampered_charges_table_never_counts_less_than_was_billed(
    server: MockServerProcess,
    held_journal: tuple[Path, list[dict[str, Any]], dict[str, Any]],
    tmp_path: Path,
) -> None:
    """Every value of every ``charges`` row altered, the table dropped, a row copied or
    deleted: the run is refused in one line naming the table, or it goes on and its journal
    counts no less than the server billed."""
    source, rows, arguments = held_journal
    with contextlib.closing(sqlite3.connect(source)) as db:
        assert db.execute("SELECT COUNT(*) FROM charges").fetchone()[0] == 2
    checked = refused = 0
    for case, path in tampered_copies(source, "charges", tmp_path):
        checked += 1
        try:
            batch = Batch(rows, journal=path, **arguments)
        except JournalUnusable as refusal:
            assert "\n" not in str(refusal) and "charges" in str(refusal), (case, refusal)
            refused += 1
            continue
        done = batch.run(retry_failed=True)
        paid = sum(Fraction(r.cost or 0) for r in done)
        assert Fraction(spent_in(path), 10**12) >= paid, Case.__str__(case)
    assert checked > 10 and refused > 5


# --- a hostile provider: answers never heard, clocks off, a busy key, refused reads ----------
@pytest.mark.parametrize(
    "fault", ["create unanswered, clock ahead", "create unanswered, clock behind",
              "create unanswered, busy key", "poll 404", "download 403"],
)  # fmt: skip
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_hostile_provider_never_makes_a_capped_run_pay_twice_or_over_the_cap(
    server: MockServerProcess, tmp_path: Path, provider: str, fault: str
) -> None:
    """Through the hostile provider (tests/hostile_batch.py): a create whose answer never
    comes, the run killed and resumed with the provider's clock 10 minutes off or thousands of
    other batches on the key; a poll or a results download refused once, then the failures
    retried. The part's reservation is kept until a run reads its answers: one batch made, no
    row run twice, the server's sum under the cap and no more than the journal counts."""
    with HostileProvider(upstream=server.url) as hostile:
        key = uuid.uuid4().hex[:10]
        url = f"{hostile.url}/llm/{key}/pace=0.05{PROVIDERS[provider][0]}"
        rows = chat_rows(random.Random(6), 12)
        (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        (tmp_path / "prices.json").write_text(json.dumps(PRICES))
        more = ["--batch-api", "--poll", "0.05", "--max-cost", "0.05", "--prices", "prices.json"]
        args = command(tmp_path / "in.jsonl", url, provider, *more)
        if fault.startswith("create"):
            hostile.skew = {"ahead": 600.0, "behind": -600.0}.get(fault.rpartition(" ")[2], 0.0)
            hostile.hold("POST", CREATE, 30.0)
            first = start(args, tmp_path)
            made = lambda: counts_so_far(server, key).get("batches_created", 0) == 1  # noqa: E731
            wait_for(made, first, "the batch was made")
            first.send_signal(signal.SIGKILL)
            first.wait()
            hostile.other_batches = 3000 if fault.endswith("busy key") else 0
            last = run([*args, "--resume"], tmp_path)
        else:
            where = POLL if fault.startswith("poll") else DOWNLOAD
            hostile.once("GET", where, status=int(fault[-3:]))
            first_run = run(args, tmp_path)
            assert first_run.returncode == 1, first_run.stderr
            with contextlib.closing(sqlite3.connect(tmp_path / "in-journal.sqlite3")) as db:
                held = db.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
            assert held == 1, "the part kept at the provider keeps its reservation"
            last = run([*args, "--retry-failed"], tmp_path)
        assert last.returncode == 0, last.stderr
        written = results(tmp_path / "in-results.jsonl")
        assert [row["index"] for row in written] == list(range(12)) and all(
            row["ok"] for row in written
        )
        counts = stats(server, key)
        assert counts["batches_created"] == 1 and counts["twice"] == []
        assert hostile.touched_others == []
        spent = billed_batches(server, key)
        assert spent <= Fraction("0.05")
        assert spent <= Fraction(spent_in(tmp_path / "in-journal.sqlite3"), 10**12)


def test_a_batch_without_a_journal_remade_by_retry_failed_counts_what_it_spent(
    server: MockServerProcess,
) -> None:
    """Parts held at the deadline by a batch without a journal, then its failures retried
    with other options (a new batch, the same parts): the parts the first one reserved are
    settled against what it counted, never as room the second one never had."""
    url, key = endpoint(server, "openai", "pace=0.3")
    rows = short_rows(40)
    first = Batch(
        rows, url=url, batch_api="openai", poll=0.05, progress=False, headers=KEY_HEADER,
        max_cost="0.02", prices=PRICES, batch_rows=5, deadline=0.2,
    ).run()  # fmt: skip
    assert not first.ok and first.summary().error_kinds["deadline"] > 0
    again = first.retry_failed(deadline=None)
    assert [r.index for r in again] == list(range(40))
    assert billed_batches(server, key) <= Fraction("0.02"), float(billed_batches(server, key))
    assert stats(server, key)["twice"] == []


def test_prices_raised_between_runs_never_count_a_billed_row_as_nothing(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """A part's first row read by a run that was stopped, then the part's batch gone when a
    second run, with dearer prices, cancels: the row nobody read stays at its worst case by
    the dearer prices, not at what the cheaper reservation had left over."""
    with HostileProvider(upstream=server.url) as hostile:
        key = uuid.uuid4().hex[:10]
        url = f"{hostile.url}/llm/{key}/pace=0.2/v1/chat/completions"
        rows = short_rows(2)
        journal = tmp_path / "j.sqlite3"
        same: dict[str, Any] = {
            "url": url, "batch_api": "openai", "poll": 0.05, "progress": False,
            "headers": KEY_HEADER, "max_cost": "1", "journal": journal,
        }  # fmt: skip

        def stop(result: Any) -> None:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            Batch(rows, prices=PRICES, on_result=stop, **same).run()
        hostile.once("GET", POLL, status=404)
        dearer = {"models": PRICES["models"], "batch": "1"}
        Batch(rows, prices=dearer, **same).cancel()
        assert Fraction(spent_in(journal), 10**12) >= billed_batches(server, key)


def test_an_answer_too_large_to_read_is_counted_once_when_a_retry_reads_it(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """A results line over --max-bytes keeps its part at the provider and its cost in the
    part's reservation; --retry-failed with a larger --max-bytes reads it: the Results cost
    what the server billed, and the journal stays one a run goes on with."""
    url, key = endpoint(server, "openai", "pace=0.1")
    rows = short_rows(4)
    for row in rows:
        row["max_tokens"] = 5
    rows[2] |= {"max_tokens": 400, "n": 20}  # (20 answers of 1 to 400 tokens: a long line)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "prices.json").write_text(json.dumps(PRICES))
    more = ["--batch-api", "--poll", "0.05", "--max-cost", "1", "--prices", "prices.json"]
    args = command(tmp_path / "in.jsonl", url, "openai", *more)
    first = run([*args, "--max-bytes", "3000"], tmp_path)
    assert first.returncode == 1, first.stderr
    assert [r["error_kind"] for r in results(tmp_path / "in-results.jsonl")][2] == "invalid_body"
    for _ in range(2):  # (read with room, then a run on the same journal again)
        again = run([*args, "--retry-failed", "--max-bytes", "10000000"], tmp_path)
        assert again.returncode == 0, again.stderr
    written = results(tmp_path / "in-results.jsonl")
    paid = sum(Fraction(row["cost"]) for row in written)
    assert abs(paid - billed_batches(server, key)) < Fraction(1, 10**9)
    assert Fraction(spent_in(tmp_path / "in-journal.sqlite3"), 10**12) == billed_batches(
        server, key
    )


def test_rows_waiting_for_room_when_the_deadline_comes_end_deadline(
    server: MockServerProcess,
) -> None:
    """The deadline ends a run while its parts are still running and rows wait for room
    under the cap: those rows end ``deadline`` (unsent), as the rows of the held parts do,
    not ``cost``."""
    url, key = endpoint(server, "openai", "pace=0.5")
    done = Batch(
        short_rows(40), url=url, batch_api="openai", poll=0.05, progress=False,
        headers=KEY_HEADER, max_cost="0.02", prices=PRICES, batch_rows=5, deadline=0.3,
    ).run()  # fmt: skip
    assert done.summary().error_kinds == {"deadline": 40}
    unsent = [r for r in done if "waited for room under max_cost" in (r.error or "")]
    assert unsent and all(r.attempts == 0 for r in unsent)
    assert stats(server, key)["rows_run"] < 40, "the rows that waited were never sent"
