"""The JSON-array input reader: linear work, flat memory, a per-element size limit, and the same
entries (or the same error) wherever the chunks happen to split the input."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsync.cli import inputs
from batchsync.cli.inputs import Entry, Input, InputError

MiB = 2**20


def read(path: Path) -> list[Entry]:
    source = Input(str(path))
    try:
        return list(source)
    finally:
        source.close()


Part = bytes | tuple[bytes, int]


def write(path: Path, *parts: Part) -> Path:
    """Write ``parts`` (bytes, or bytes repeated so many times) a block at a time. Big inputs
    are never built in memory: this process's peak RSS shows in later tests' subprocesses
    (test_integration measures one's)."""
    with path.open("wb") as out:
        for part in parts:
            piece, times = part if isinstance(part, tuple) else (part, 1)
            per_block = max(1, 2**16 // len(piece))
            for done in range(0, times, per_block):
                out.write(piece * min(per_block, times - done))
    return path


def one_big_element(path: Path, mib: int, secret: bytes = b"x") -> Path:
    """An array of three items whose second has an ``id`` of ``mib`` MiB."""
    return write(
        path,
        b'[{"url": "http://h.test/1"},\n {"url": "http://h.test/2", "id": "',
        (secret, mib * MiB // len(secret)),
        b'"},\n {"url": "http://h.test/3"}]\n',
    )


@pytest.fixture
def decoder_work(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The characters handed to the JSON decoder, one count per call."""
    calls: list[int] = []
    raw_decode = json.JSONDecoder.raw_decode

    def counting(self: json.JSONDecoder, s: str, idx: int = 0) -> tuple[Any, int]:
        calls.append(len(s) - idx)
        return raw_decode(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counting)
    yield calls


# --- (a) linear work ---------------------------------------------------------------------


def test_the_decoder_sees_each_character_about_once(
    tmp_path: Path, decoder_work: list[int]
) -> None:
    """The issue: each chunk read on into a big element re-decoded the element from its start,
    so a 32 MB element took 8.6 s. Whatever the element's size, the decoder must be handed about
    the input once (counted, not timed: the same on any machine)."""
    work = {}
    for size in (4, 8):
        path = one_big_element(tmp_path / f"{size}.json", size)
        decoder_work.clear()
        entries = read(path)
        assert [entry.where for entry in entries] == ["element 1", "element 2", "element 3"]
        work[size] = sum(decoder_work)
        assert work[size] <= 2 * path.stat().st_size, (size, work[size])
    assert work[8] <= 2.5 * work[4]  # grows linearly, at most


def test_an_element_just_under_the_limit_is_decoded_once(
    tmp_path: Path, decoder_work: list[int]
) -> None:
    size = inputs.MAX_ELEMENT_BYTES - 100
    path = write(tmp_path / "input.json", b'[1, {"id": "', (b"y", size), b'"}, 3]')
    assert [entry.item for entry in read(path)] == [1, {"id": "y" * size}, 3]
    assert sum(decoder_work) <= 2 * path.stat().st_size


def test_reading_time_grows_linearly(tmp_path: Path) -> None:
    """A check by the clock, with generous slack: 4 times the element, at most 8 times the
    CPU time (quadratic would be 16 times)."""

    def cpu_seconds(size: int) -> float:
        path = one_big_element(tmp_path / f"{size}.json", size)
        best = float("inf")
        for _ in range(2):
            started = time.process_time()
            assert len(read(path)) == 3
            best = min(best, time.process_time() - started)
        return best

    small, large = cpu_seconds(4), cpu_seconds(16)
    assert large < 8 * small + 0.5, (small, large)


# --- (b) the per-element limit -------------------------------------------------------------


def test_an_element_over_the_limit_is_that_items_problem(tmp_path: Path) -> None:
    secret = "s3cr3t-"
    path = one_big_element(tmp_path / "input.json", 3, secret=secret.encode())
    entries = read(path)
    assert entries[0] == Entry("element 1", {"url": "http://h.test/1"})
    assert entries[2] == Entry("element 3", {"url": "http://h.test/3"})
    over = entries[1]
    limit = inputs.MAX_ELEMENT_BYTES
    assert f"{over.where}: {over.problem}" == f"element 2: longer than {limit} bytes"
    assert over.item is None
    assert secret not in repr(over)


def test_the_limit_counts_utf8_bytes_from_the_elements_first_character(tmp_path: Path) -> None:
    """``"é…é"`` of exactly MAX_ELEMENT_BYTES bytes is kept; one byte more is not. Blank space
    before an element does not count."""
    length = (inputs.MAX_ELEMENT_BYTES - 2) // 2  # 2 bytes each, plus the quotes
    e_acute = "é".encode()
    path = write(
        tmp_path / "input.json",
        b"[", (b" ", MiB), b'"', (e_acute, length), b'",\n"', (e_acute, length), b'x"]',
    )  # fmt: skip
    first, second = read(path)
    assert first == Entry("element 1", "é" * length)
    assert (second.where, second.problem) == (
        "element 2",
        f"longer than {inputs.MAX_ELEMENT_BYTES} bytes",
    )


@pytest.mark.parametrize(
    "big",
    [
        # brackets, commas and quotes inside strings, escapes across chunk ends
        (b'"', (b'\\"],[{\\\\', MiB // 8 + 1), b'"'),
        (b"[", (b'[1, {"a": "]"}], ', MiB // 16), b"0]"),
        ((b"[", MiB // 2 + 1), (b"]", MiB // 2 + 1)),
        ((b"1", MiB + 1),),
    ],
    ids=["escapes", "nested", "deep", "number"],
)
def test_over_limit_elements_of_any_shape_are_passed_over(
    tmp_path: Path, big: tuple[Part, ...]
) -> None:
    path = write(tmp_path / "input.json", b"[1, ", *big, b', {"url": "http://h.test/3"}, [4]]')
    entries = read(path)
    assert [(entry.where, entry.problem) for entry in entries] == [
        ("element 1", None),
        ("element 2", f"longer than {inputs.MAX_ELEMENT_BYTES} bytes"),
        ("element 3", None),
        ("element 4", None),
    ]
    assert [entry.item for entry in entries] == [1, None, {"url": "http://h.test/3"}, [4]]


def test_the_cli_reports_an_over_limit_element_without_its_text(tmp_path: Path) -> None:
    write(
        tmp_path / "input.json",
        b'[{"url": "http://127.0.0.1:9/a"}, {"url": "http://127.0.0.1:9/b", "id": "',
        (b"s3cr3t-", 2 * MiB // 7),
        b'"}]',
    )
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "input.json", "--attempts", "1", "--timeout", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    results = [
        json.loads(line) for line in (tmp_path / "input-results.jsonl").read_text().splitlines()
    ]
    assert [(r["error_kind"], r["url"]) for r in results] == [
        ("connection", "http://127.0.0.1:9/a"),
        ("invalid_request", None),
    ]
    assert results[1]["error"] == f"element 2: longer than {inputs.MAX_ELEMENT_BYTES} bytes"
    failed = [
        json.loads(line) for line in (tmp_path / "input-failed.jsonl").read_text().splitlines()
    ]
    assert failed == [
        {"url": "http://127.0.0.1:9/a"},
        {"invalid": results[1]["error"], "given": None},
    ]
    for name in ("input-results.jsonl", "input-failed.jsonl"):
        assert "s3cr3t-" not in (tmp_path / name).read_text()
    assert "s3cr3t-" not in done.stderr


# --- (c) flat memory ------------------------------------------------------------------------


def test_memory_stays_flat_for_a_60_mb_element(tmp_path: Path) -> None:
    path = one_big_element(tmp_path / "input.json", 60)
    source = Input(str(path))
    try:
        tracemalloc.start()
        try:
            assert source.count() == 3
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        source.close()
    assert peak < 4 * MiB, peak


# --- what the reader already guaranteed ------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b" \n\t[", "the JSON array ends too soon"),
        (b'[{"url": "http://h.test"}, ', "the JSON array ends too soon"),
        ((b'[{"url": "http://h.test"}, "', (b"x", 3 * MiB)), "the JSON array ends too soon"),
        (b"[1 2]", "expected ',' or ']' after element 1 of the JSON array"),
        (b"[1 2", "expected ',' or ']' after element 1 of the JSON array"),
        (b"[1, 2", "the JSON array ends too soon"),
        (b'[1, "abc', "element 2 of the JSON array is not valid JSON"),
        (b'[1, {"a": 1}}]', "expected ',' or ']' after element 2 of the JSON array"),
        (b"[1,]", "element 2 of the JSON array is not valid JSON"),
        (b"[1,,2]", "element 2 of the JSON array is not valid JSON"),
        (b"[1, [2}]", "element 2 of the JSON array is not valid JSON"),
        (b"[1, tru]", "element 2 of the JSON array is not valid JSON"),
        (
            b"[" + b"[" * 100_000 + b"]" * 100_000 + b"]",
            "element 1 of the JSON array is nested too",
        ),
        (b'[1, "caf\xe9"]', "the JSON array is not UTF-8 text: invalid continuation byte"),
        ((b'[1, "', (b"x", 3 * MiB), b'\xff", 3]'), "the JSON array is not UTF-8 text: invalid"),
    ],
)
def test_a_broken_array_is_an_input_error(
    tmp_path: Path, content: bytes | tuple[Part, ...], message: str
) -> None:
    path = write(tmp_path / "input.json", *(content if isinstance(content, tuple) else [content]))
    source = Input(str(path))
    with pytest.raises(InputError) as raised:
        source.count()
    source.close()
    assert source.is_array
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("content", "items"),
    [
        (b"[]", []),
        (b"\xef\xbb\xbf \n[ \r\n\t ]", []),
        ("[\u00a0\u2003]".encode(), []),
        (b"[1]  trailing text is ignored", [1]),
        (
            '[ "é" ,\u00a0{"url": "http://h.test/ü"}\u2003]'.encode(),
            ["é", {"url": "http://h.test/ü"}],
        ),
        (b"[1.5e3, -0, true, null, Infinity]", [1500.0, 0, True, None, float("inf")]),
    ],
)
def test_valid_arrays_read_as_before(tmp_path: Path, content: bytes, items: list[Any]) -> None:
    path = tmp_path / "input.json"
    path.write_bytes(content)
    entries = read(path)
    assert [entry.item for entry in entries] == items
    assert [entry.where for entry in entries] == [f"element {n}" for n in range(1, len(items) + 1)]
    assert all(entry.problem is None for entry in entries)


def test_entries_come_before_the_rest_is_read(tmp_path: Path) -> None:
    """Lazily: the first element is there before a break far into the input is found."""
    path = write(
        tmp_path / "input.json", b'[{"url": "http://h.test/1"}, "', (b"x", 3 * MiB), b'", oops]'
    )
    source = Input(str(path))
    entries = iter(source)
    assert next(entries) == Entry("element 1", {"url": "http://h.test/1"})
    with pytest.raises(InputError, match="not valid JSON"):
        list(entries)
    source.close()


# --- any array, any chunking ----------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
    | st.sampled_from(['"', "\\", "\\\"", "[", "]", "{", "}", ",", "\\\\\"],"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)  # fmt: skip
blank = st.text(alphabet=" \t\r\n\u00a0\u2028", max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    elements=st.lists(st.tuples(blank, json_values, st.booleans(), blank), max_size=6),
    chunk=st.sampled_from([1, 2, 3, 5, 8, 64, 2**16]),
    small_limit=st.sampled_from([8, 40, None]),
)
def test_any_array_reads_the_same_however_it_is_chunked(
    tmp_path_factory: pytest.TempPathFactory,
    elements: list[tuple[str, Any, bool, str]],
    chunk: int,
    small_limit: int | None,
) -> None:
    limit = small_limit or inputs.MAX_ELEMENT_BYTES
    texts = [
        before + json.dumps(value, ensure_ascii=ascii, indent=1 if ascii else None) + after
        for before, value, ascii, after in elements
    ]
    path = tmp_path_factory.mktemp("array") / "input.json"
    path.write_text("[" + ",".join(texts) + "]", encoding="utf-8")
    with (
        mock.patch.object(inputs, "_ARRAY_CHUNK", chunk),
        mock.patch.object(inputs, "MAX_ELEMENT_BYTES", limit),
    ):
        entries = read(path)
    assert [entry.where for entry in entries] == [f"element {n + 1}" for n in range(len(texts))]
    for entry, text, (_, value, _, _) in zip(entries, texts, elements, strict=True):
        if len(text.lstrip().encode()) > limit:
            assert (entry.item, entry.problem) == (None, f"longer than {limit} bytes")
        else:
            assert (entry.item, entry.problem) == (value, None)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet='[]{},:"\\ 1ax\u00e9', max_size=40).map(lambda t: "[" + t),
    chunk=st.sampled_from([1, 2, 3, 7]),
    small_limit=st.sampled_from([4, None]),
)
def test_broken_arrays_read_the_same_however_they_are_chunked(
    tmp_path_factory: pytest.TempPathFactory, text: str, chunk: int, small_limit: int | None
) -> None:
    limit = small_limit or inputs.MAX_ELEMENT_BYTES
    path = tmp_path_factory.mktemp("broken") / "input.json"
    path.write_text(text, encoding="utf-8")

    def outcome(size: int) -> tuple[list[Entry], str | None]:
        entries: list[Entry] = []
        with (
            mock.patch.object(inputs, "_ARRAY_CHUNK", size),
            mock.patch.object(inputs, "MAX_ELEMENT_BYTES", limit),
        ):
            try:
                entries.extend(read(path))
            except InputError as exc:
                return entries, str(exc)
        return entries, None

    whole, split = outcome(2**16), outcome(chunk)
    assert split[1] == whole[1]
    if whole[1] is None:
        assert split[0] == whole[0]
    if small_limit is None:
        try:
            value = json.loads(text)
        except ValueError:
            pass
        else:  # whatever the standard decoder reads, the reader reads the same
            assert whole == ([Entry(f"element {n + 1}", v) for n, v in enumerate(value)], None)
