"""Looking for counter-examples: property tests of the engine, chaos, hostile input, the
private-network guard, and resources left behind."""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import gc
import json
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import responses
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsync import Backoff, Batch, fetch_all
from batchsync.cli.inputs import Input, InputError
from batchsync.core.engine import Engine
from batchsync.core.result import Result
from batchsync.core.task import Route, Task
from batchsync.core.verdict import Feedback, Verdict, retry, success, terminal
from batchsync.http import guard
from batchsync.http.classify import host_feedback
from batchsync.http.httpfacts import HttpFacts
from batchsync.jobs.options import EngineOptions

from .mockserver import ROOT, MockServerProcess, mock_server_command

FAST = Backoff(base=0.005, factor=2.0, max=0.02, jitter=0.5)


# --- property tests of the engine -------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What one scripted attempt does: sleep, then answer (or raise)."""

    delay: float
    outcome: str  # ok | retry | terminal | timeout | raise
    retry_after: float | None = None


steps = st.builds(
    Step,
    delay=st.sampled_from([0.0, 0.001, 0.005, 0.02]),
    outcome=st.sampled_from(["ok", "retry", "retry", "terminal", "timeout", "raise"]),
    retry_after=st.one_of(st.none(), st.sampled_from([0.0, 0.01, 0.03, 5.0])),
)


@dataclass
class FaultyJob:
    """Item ``n`` plays ``schedules[n]`` one step per attempt (the last step repeats)."""

    schedules: list[list[Step]]
    timeout: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: int = 0
    peak: int = 0
    sent: dict[int, int] = field(default_factory=dict)

    def label(self, item: object) -> tuple[str | None, Any]:
        return str(item), None

    def feedback(self, verdict: Verdict) -> Feedback:
        return host_feedback(verdict)

    def prepare(self, item: object) -> Task:
        index = int(str(item))
        return Task(str(item), None, Route(lambda ends_at, so_far: self._attempt(index)))

    def _attempt(self, index: int) -> Verdict:
        with self.lock:
            number = self.sent.get(index, 0)
            self.sent[index] = number + 1
            self.active += 1
            self.peak = max(self.peak, self.active)
        schedule = self.schedules[index]
        step = schedule[min(number, len(schedule) - 1)]
        try:
            time.sleep(step.delay)
            if step.outcome == "raise":
                raise RuntimeError("scripted bug")
            return {
                "ok": lambda: success("data", HttpFacts(200)),
                "retry": lambda: retry("status", "HTTP 503", HttpFacts(503), step.retry_after),
                "terminal": lambda: terminal("status", "HTTP 404", HttpFacts(404)),
                "timeout": lambda: retry("timeout", "timed out"),
            }[step.outcome]()
        finally:
            with self.lock:
                self.active -= 1


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    schedules=st.lists(st.lists(steps, min_size=1, max_size=4), max_size=20),
    concurrency=st.integers(1, 6),
    attempts=st.integers(1, 4),
    budget=st.sampled_from([0.05, 0.2, 1.0]),
    deadline=st.sampled_from([None, 0.1, 1.0]),
)
def test_engine_invariants_hold_for_any_fault_schedule(
    schedules: list[list[Step]], concurrency: int, attempts: int, budget: float,
    deadline: float | None,
) -> None:  # fmt: skip
    job = FaultyJob(schedules)
    options = EngineOptions(
        concurrency=concurrency, attempts=attempts, budget=budget, deadline=deadline,
        backoff=FAST,
    )  # fmt: skip
    results: dict[int, list[Result]] = {}
    lock = threading.Lock()

    def deliver(result: Result, item: object) -> None:
        with lock:
            results.setdefault(result.index, []).append(result)

    Engine(options).run(job, enumerate(str(n) for n in range(len(schedules))), deliver)

    assert sorted(results) == list(range(len(schedules)))  # every item...
    assert all(len(found) == 1 for found in results.values())  # ...exactly once
    assert job.peak <= concurrency
    for index, schedule in enumerate(schedules):
        result = results[index][0]
        sent = job.sent.get(index, 0)
        assert result.attempts == sent <= attempts
        played = [schedule[min(n, len(schedule) - 1)] for n in range(sent)]
        final = [n for n, step in enumerate(played) if step.outcome in ("terminal", "raise")]
        if final:  # a final answer is never retried
            assert final[0] == sent - 1
        for record, step in zip(result.attempt_log, played, strict=True):
            if record.wait is not None and step.outcome == "retry" and step.retry_after:
                assert record.wait >= step.retry_after  # Retry-After is a floor
        # No wait runs past the budget: each was decided against what was left of it (the
        # waits' own sum, not the wall clock, which a loaded machine stretches).
        assert sum(record.wait or 0.0 for record in result.attempt_log) < budget
        slowest = max((step.delay for step in schedule), default=0.0)
        assert result.elapsed <= budget + slowest + 2.0  # and nothing hangs


# --- chaos against the real mock server ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_server_on(port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        mock_server_command(port), stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert process.stdout is not None
    assert process.stdout.readline().startswith("listening on ")
    return process


class Outage:
    """A mock server of its own that goes down after ``after`` results (as an on_result hook),
    and comes back half a second later when ``back`` is set."""

    def __init__(self, after: int, back: bool) -> None:
        self.port = free_port()
        self._servers = [start_server_on(self.port)]
        self._after = after
        self._back = back
        self._finished = 0

    def urls(self, count: int) -> list[str]:
        return [f"http://127.0.0.1:{self.port}/ok/{n}?delay=0.02" for n in range(count)]

    def __call__(self, result: Result) -> None:
        self._finished += 1
        if self._finished == self._after:
            self._servers[0].kill()
            if self._back:
                restart = lambda: self._servers.append(start_server_on(self.port))  # noqa: E731
                threading.Timer(0.5, restart).start()

    def end(self) -> None:
        for server in self._servers:
            server.kill()


@pytest.mark.integration
def test_a_server_killed_and_restarted_mid_batch() -> None:
    outage = Outage(after=50, back=True)
    urls = outage.urls(200)
    try:
        # Without the breaker, retries carry every item over the outage.
        rs = fetch_all(
            urls, concurrency=8, attempts=6, backoff=Backoff(base=0.2, max=1.0),
            on_result=outage, breaker=None,
        )  # fmt: skip
    finally:
        outage.end()
    assert [r.url for r in rs] == urls
    assert [r for r in rs if not r.ok] == []
    kinds = {record.error_kind for r in rs for record in r.attempt_log}
    assert "connection" in kinds
    assert kinds <= {None, "connection", "timeout"}


@pytest.mark.integration
def test_a_server_that_stays_down_opens_the_circuit() -> None:
    outage = Outage(after=50, back=False)
    urls = outage.urls(200)
    try:
        # A budget shorter than the break (5 s): the held items cannot wait it out.
        rs = fetch_all(urls, concurrency=8, attempts=3, backoff=FAST, budget=4, on_result=outage)
    finally:
        outage.end()
    assert [r.url for r in rs] == urls
    assert sum(r.ok for r in rs) >= 50
    assert {r.error_kind for r in rs} <= {None, "connection", "circuit_open"}
    refused = [r for r in rs if r.error_kind == "circuit_open"]
    assert len(refused) > 100  # the rest ended unsent instead of burning their budgets
    assert rs.summary().circuits_opened == 1


@pytest.mark.integration
def test_half_written_responses_are_connection_failures(server: MockServerProcess) -> None:
    rs = fetch_all([f"{server.url}/half/{uuid.uuid4().hex}"] * 1, attempts=3, backoff=FAST)
    assert (rs[0].ok, rs[0].error_kind, rs[0].attempts) == (False, "connection", 3)


class ChaosProxy:
    """A TCP proxy on 127.0.0.1 that drops a share of connections and delays the rest."""

    def __init__(self, target_port: int, drop: float, delay: float, seed: int) -> None:
        self._target = target_port
        self._drop = drop
        self._delay = delay
        self._random = random.Random(seed)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> ChaosProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._random.random() < self._drop:
            writer.transport.abort()  # a reset, as a dropped connection looks
            return
        await asyncio.sleep(self._delay * self._random.random())
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self._target)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


@pytest.mark.integration
def test_a_proxy_that_drops_and_delays_connections(server: MockServerProcess) -> None:
    target = int(server.url.rsplit(":", 1)[1])
    with ChaosProxy(target, drop=0.3, delay=0.05, seed=7) as proxy:
        urls = [f"http://127.0.0.1:{proxy.port}/ok/chaos-{n}" for n in range(80)]
        # one connection per request, so that each meets the proxy's dice
        rs = fetch_all(
            [{"url": url, "headers": {"Connection": "close"}} for url in urls],
            concurrency=4, attempts=8, backoff=FAST,
        )  # fmt: skip
    assert [r.url for r in rs] == urls
    assert sum(r.ok for r in rs) >= 75
    assert {r.error_kind for r in rs} <= {None, "connection"}
    assert any(record.error_kind == "connection" for r in rs for record in r.attempt_log)


# --- hostile input ----------------------------------------------------------------------

line_text = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["http://127.0.0.1:9/x", '{"url": "http://127.0.0.1:9/y"}', "# note", ""]),
    st.builds(lambda n: "[" * n + "]" * n, st.integers(0, 3000)),
    st.builds(lambda n: '{"url": ' + "[" * n + "]" * n + "}", st.integers(900, 3000)),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    lines=st.lists(st.one_of(line_text.map(str.encode), st.binary(max_size=60)), max_size=30),
    newline=st.sampled_from([b"\n", b"\r\n"]),
    bom=st.booleans(),
)
def test_the_reader_survives_any_bytes(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], newline: bytes, bom: bool
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "input.txt"
    content = (b"\xef\xbb\xbf" if bom else b"") + newline.join(lines)
    path.write_bytes(content)
    source = Input(str(path))
    try:
        entries = list(source)
    except InputError:
        assert source.is_array  # only a whole JSON array can be unreadable
        return
    finally:
        source.close()
    if source.is_array:
        return
    physical = len(content.split(b"\n"))
    numbers = [int(entry.where.split()[1]) for entry in entries]
    assert numbers == sorted(set(numbers))
    assert all(1 <= n <= physical for n in numbers)
    assert all(entry.problem is None or entry.problem for entry in entries)


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\x01\x02\xff\xfe",
        b"\xef\xbb\xbfhttp://127.0.0.1:9/a\r\nnot a url\r\n",
        b"http://127.0.0.1:9/a\n" + b"x" * (3 * 2**20) + b"\nhttp://127.0.0.1:9/b\n",
        b'{"url": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        b"[" + b"[" * 100_000 + b"]" * 100_000 + b"]",
        b"[1, 2",
        b'{"url": "http://127.0.0.1:9/\x00"}\n',
        "http://127.0.0.1:9/caf\u00e9\n".encode("latin-1"),
    ],
)
def test_the_cli_never_shows_a_traceback_for_hostile_input(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "input.txt").write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "input.txt", "--attempts", "1", "--timeout", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "Traceback" not in done.stderr
    assert done.returncode in (0, 1, 2), done.stderr
    if done.returncode == 2:
        assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1
        return
    results = [json.loads(line) for line in (tmp_path / "input-results.jsonl").open()]
    for result in results:
        if result["error_kind"] == "invalid_request":
            assert result["error"].startswith("line ")


# --- the private-network guard ----------------------------------------------------------

PUBLIC, PRIVATE = "93.184.216.34", "10.0.0.5"


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """public.test and internal.test resolve without any DNS traffic."""
    table = {"public.test": [PUBLIC], "internal.test": [PRIVATE], "127.0.0.1": ["127.0.0.1"]}
    monkeypatch.setattr(guard, "resolve", lambda host: table.get(host, ["127.0.0.1"]))


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", True), ("::1", True), ("10.1.2.3", True), ("172.16.0.1", True),
        ("192.168.1.1", True), ("169.254.169.254", True), ("fe80::1", True),
        ("224.0.0.1", True), ("0.0.0.0", True), ("::ffff:127.0.0.1", True),
        ("93.184.216.34", False), ("2606:4700::1111", False), ("8.8.8.8", False),
    ],
)  # fmt: skip
def test_which_addresses_the_guard_refuses(address: str, refused: bool) -> None:
    assert guard.denied(address) is refused


@pytest.mark.integration
def test_private_hosts_are_refused_before_anything_is_sent(
    fresh_server: MockServerProcess, tmp_path: Path
) -> None:
    port = fresh_server.url.rsplit(":", 1)[1]
    urls = [f"{fresh_server.url}/ok/a", f"http://localhost:{port}/ok/b"]
    rs = fetch_all(urls, deny_private=True)
    assert [(r.error_kind, r.attempts) for r in rs] == [("invalid_request", 0)] * 2
    assert "a private or local address (deny_private)" in (rs[0].error or "")
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "urls.txt", "--deny-private"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert fresh_server.stats()["requests"] == 0


def test_a_redirect_to_a_private_host_is_refused(fake_dns: None) -> None:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mocked:
        mocked.get(
            "http://public.test/r", status=302, headers={"Location": "http://internal.test/x"}
        )
        inside = mocked.get("http://internal.test/x", json={"secret": True})
        (result,) = fetch_all(["http://public.test/r"], deny_private=True)
    assert (result.error_kind, result.attempts) == ("invalid_request", 1)
    assert "internal.test resolves to 10.0.0.5" in (result.error or "")
    assert inside.call_count == 0


@pytest.mark.integration
def test_a_connection_that_reaches_a_private_address_is_cut(
    server: MockServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the check saw a public address, the connection reached a local one."""
    monkeypatch.setattr(guard, "resolve", lambda host: [PUBLIC])
    marker = uuid.uuid4().hex
    (result,) = fetch_all([f"{server.url}/ok/{marker}"], deny_private=True, attempts=3)
    assert (result.error_kind, result.attempts) == ("invalid_request", 1)
    assert "connected to 127.0.0.1" in (result.error or "")
    assert server.count(f"/ok/{marker}") == 0


# --- resources left behind ----------------------------------------------------------------


def open_descriptors() -> tuple[int, int]:
    """(file descriptors, sockets) this process has open."""
    kinds = []
    for fd in list(Path("/proc/self/fd").iterdir()):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, now gone
            kinds.append(str(fd.readlink()))
    return len(kinds), sum(1 for kind in kinds if kind.startswith("socket:"))


def batchsync_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("batchsync")]


@pytest.fixture
def settle() -> Iterator[None]:
    # What earlier tests in this process left for the garbage collector (sockets among it)
    # goes now, not in the middle of the count (the suite runs several tests per process).
    gc.collect()
    time.sleep(0.1)
    yield


@pytest.mark.integration
def test_a_large_faulty_batch_leaves_nothing_open(server: MockServerProcess, settle: None) -> None:
    paths = ["/ok/{n}", "/404/{n}", "/503/{n}", "/broken-json/{n}", "/ok/{n}?delay=0.01"]
    urls = [server.url + paths[n % len(paths)].format(n=n) for n in range(10_000)]
    fetch_all(urls[:10])  # warm the imports and the server
    before = open_descriptors()
    rs = fetch_all(urls, concurrency=32, attempts=2, backoff=FAST, timeout=5)
    assert len(rs) == 10_000
    assert batchsync_threads() == []
    assert open_descriptors() == before


@pytest.mark.integration
def test_an_interrupted_batch_leaves_nothing_open(server: MockServerProcess, settle: None) -> None:
    marker = uuid.uuid4().hex[:8]
    urls = [f"{server.url}/ok/{marker}-{n}?delay=0.5" for n in range(200)]
    before = open_descriptors()
    batch = Batch(urls, concurrency=8)

    def interrupt() -> None:
        while server.count(f"/ok/{marker}-0?delay=0.5") == 0:
            time.sleep(0.02)
        time.sleep(0.6)
        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        batch.run()
    assert batchsync_threads() == []
    assert open_descriptors() == before
