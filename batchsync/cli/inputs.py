"""Reading INPUT lazily: one item per line (a URL or a JSON object), or one JSON array.

Every entry becomes an ``Entry``: the item, or the reason it is not one (reported later as
that item's ``invalid_request`` Result, with its line or element number and never its text,
which may hold a secret) — such as a line or an array element longer than 1 MiB, which is
skipped without being parsed. Only an input that cannot be read at all raises ``InputError``.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..http.paginate import Continued
from ..http.template import RowError, Template

MAX_LINE_BYTES = 2**20
MAX_ELEMENT_BYTES = MAX_LINE_BYTES
_ARRAY_CHUNK = 2**16

# Where a JSON array's scanner must look next. Each pattern matches (maybe nothing) up to where
# the scanner has to decide something; possessive, so that no match keeps state to backtrack into.
_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
# within an element's brackets: up to the next bracket, or a string that goes on past the chunk
_NESTED = re.compile(r'(?:[^"\[\]{}]++|' + _STRING + r")*+", re.DOTALL)
# at the element's own level: the same, and up to a ','
_TOP = re.compile(r'(?:[^"\[\]{},]++|' + _STRING + r")*+", re.DOTALL)
_BLANK = re.compile(r"\s*+")  # what str.isspace() calls blank
_AFTER_ELEMENT = re.compile(r"\s*+([,\]])\s*+")
_DECODER = json.JSONDecoder()


class InputError(Exception):
    """The input as a whole cannot be read or parsed."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One input entry: where it stands, the item read from it, or why it is not an item.

    An entry with a ``problem`` keeps its line as given in ``item`` (for the failed file)
    when that is text that can be written back, else None.
    """

    where: str
    item: object
    problem: str | None = None
    # A resumed run's paginated item that goes on from a later page.
    going_on: Continued | None = None


def _parse_line(where: str, raw: bytes) -> Entry | None:
    """The entry on one line, or None for blank lines and comments."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return Entry(where, None, "not UTF-8 text")
    if not text or text.startswith("#"):
        return None
    if "\x00" in text:
        return Entry(where, None, "contains a NUL byte")
    if not text.startswith("{"):
        return Entry(where, text)
    try:
        value = json.loads(text)
    except RecursionError:
        return Entry(where, text, "JSON nested too deeply")
    except json.JSONDecodeError as exc:  # (its message says where, never what)
        return Entry(where, text, f"not valid JSON: {exc.msg} at column {exc.colno}")
    except ValueError:  # a number too long to convert, say: its message quotes it
        return Entry(where, text, "not valid JSON")
    if not isinstance(value, dict):
        return Entry(where, text, "a JSON line must be an object")
    return Entry(where, value)


def _read_lines(stream: IO[bytes]) -> Iterator[Entry]:
    for number, line in enumerate(iter(lambda: stream.readline(MAX_LINE_BYTES + 1), b""), 1):
        where = f"line {number}"
        raw = line.removeprefix(codecs.BOM_UTF8) if number == 1 else line
        if len(raw) > MAX_LINE_BYTES:
            tail = raw
            while tail and not tail.endswith(b"\n"):
                tail = stream.readline(MAX_LINE_BYTES)
            yield Entry(where, None, f"line is longer than {MAX_LINE_BYTES} bytes")
            continue
        entry = _parse_line(where, raw)
        if entry is not None:
            yield entry


class _ArrayReader:
    """The elements of a JSON array as Entries, read from a byte stream a chunk at a time.

    An element whole within a chunk is decoded at once; else a scanner finds its ``,`` or ``]``
    without decoding, and its text alone goes to the decoder. One longer than MAX_ELEMENT_BYTES
    is passed over unkept, that element's problem. So time is linear in the input, and memory
    holds a chunk and at most one element. Not UTF-8, or a kept element not JSON: InputError;
    text after the closing ``]`` is ignored.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        # where the scanner is within the current element
        self._nesting, self._in_string, self._escaped = 0, False, False

    def _chunks(self) -> Iterator[str]:
        """The stream's text a chunk at a time, a leading BOM dropped."""
        utf8 = codecs.getincrementaldecoder("utf-8-sig")()
        while True:
            chunk = self._stream.read(_ARRAY_CHUNK)
            try:
                text = utf8.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise InputError(f"the JSON array is not UTF-8 text: {exc.reason}") from None
            if text:
                yield text
            if not chunk:
                return

    def __iter__(self) -> Iterator[Entry]:
        chunks = self._chunks()
        text, pos = self._blank(chunks, "", 0)
        if text[pos] != "[":
            raise InputError("not a JSON array")
        text, pos = self._blank(chunks, text, pos + 1)
        if text[pos] == "]":
            return
        number = 0
        while True:  # at the first character of an element
            number += 1
            where = f"element {number}"
            try:  # the element and the ',' or ']' after it lie within this chunk
                value, end = _DECODER.raw_decode(text, pos)
                after = _AFTER_ELEMENT.match(text, end)
            except (ValueError, RecursionError):
                after = None
            # (not longer than MAX_ELEMENT_BYTES either: at most 4 bytes a character)
            if after is not None and (after.start(1) - pos) * 4 <= MAX_ELEMENT_BYTES:
                yield Entry(where, value)
                closing = after[1] == "]"
                pos = after.end()
            else:
                text, end, kept = self._element(number, chunks, text, pos)
                if kept is None:
                    yield Entry(where, None, f"longer than {MAX_ELEMENT_BYTES} bytes")
                else:
                    yield Entry(where, _decode_element(number, kept))
                closing = text[end] == "]"
                pos = end + 1
            if closing:
                return
            text, pos = self._blank(chunks, text, pos)

    @staticmethod
    def _blank(chunks: Iterator[str], text: str, pos: int) -> tuple[str, int]:
        """The chunk and position of the first non-blank character from ``pos`` on."""
        pos = _past(_BLANK, text, pos)
        while pos == len(text):
            following = next(chunks, None)
            if following is None:
                raise InputError("the JSON array ends too soon")
            text, pos = following, _past(_BLANK, following, 0)
        return text, pos

    def _element(
        self, number: int, chunks: Iterator[str], text: str, pos: int
    ) -> tuple[str, int, str | None]:
        """The element from ``pos`` on through ``chunks``: the chunk where it ends, where its
        ``,`` or ``]`` is there, and its text (None: longer than MAX_ELEMENT_BYTES, not kept)."""
        self._nesting, self._in_string, self._escaped = 0, False, False
        parts: list[str] = []
        size = 0
        while True:
            end = self._scan(text, pos)
            if size <= MAX_ELEMENT_BYTES:
                piece = text[pos:end] if end >= 0 else text[pos:]
                size += len(piece) if piece.isascii() else len(piece.encode())
                parts.append(piece)
                if size > MAX_ELEMENT_BYTES:
                    parts.clear()
            if end >= 0:
                return text, end, "".join(parts) if size <= MAX_ELEMENT_BYTES else None
            following = next(chunks, None)
            if following is None:
                if size <= MAX_ELEMENT_BYTES:  # what is wrong with it, if anything
                    _decode_element(number, "".join(parts))
                raise InputError("the JSON array ends too soon")
            text, pos = following, 0

    def _scan(self, text: str, pos: int) -> int:
        """Where the current element's ``,`` or ``]`` is in ``text`` from ``pos``; -1: not here."""
        nesting, in_string, escaped = self._nesting, self._in_string, self._escaped
        end, size = -1, len(text)
        while pos < size:
            if in_string:
                pos, escaped, in_string = _through_string(text, pos, escaped)
                continue
            pos = _past(_NESTED if nesting else _TOP, text, pos)
            if pos == size:
                break
            char = text[pos]
            if not nesting and char in ",]":
                end = pos
                break
            pos += 1
            if char == '"':  # a string that goes on past this chunk
                in_string = True
            elif char in "[{":
                nesting += 1
            elif nesting:
                nesting -= 1
            # else a '}' with nothing open: the decoder will find the element is not JSON
        self._nesting, self._in_string, self._escaped = nesting, in_string, escaped
        return end


def _through_string(text: str, pos: int, escaped: bool) -> tuple[int, bool, bool]:
    """Scan on in a string begun in an earlier chunk (``escaped``: that one ended on its
    backslash), escape to escape at str.find's speed: where the scan goes on, whether this
    chunk ends on a backslash, and whether the string goes on past it."""
    size = len(text)
    if escaped:
        pos += 1
    quote = text.find('"', pos)
    while True:
        if 0 <= quote < pos:
            quote = text.find('"', pos)
        backslash = text.find("\\", pos, size if quote < 0 else quote)
        if backslash < 0:
            break
        pos = backslash + 2
    in_string = quote < 0
    return (size if in_string else quote + 1), pos > size, in_string


def _spooled(stream: IO[bytes], name: str) -> IO[bytes]:
    """A temporary file holding what ``stream`` gives, read to its end once."""
    spool = tempfile.TemporaryFile(prefix="batchsync-input-")  # noqa: SIM115
    try:
        shutil.copyfileobj(stream, spool)
    except OSError as exc:
        spool.close()
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    return spool


def is_spooled(name: str) -> bool:
    """Whether INPUT ``name`` is read through a spool: stdin, or a path that names no
    regular file (a pipe, a FIFO; one that cannot be looked at is left to ``Input``)."""
    if name == "-":
        return True
    try:
        return not stat.S_ISREG(Path(name).stat().st_mode)
    except (OSError, ValueError):
        return False


def _past(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where ``pattern``, which matches anywhere (maybe nothing), stops matching from ``pos``."""
    match = pattern.match(text, pos)
    assert match is not None
    return match.end()


def _decode_element(number: int, text: str) -> Any:
    """One element's value, from its text (blank space around it allowed)."""
    try:
        value, end = _DECODER.raw_decode(text, _past(_BLANK, text, 0))
    except RecursionError:
        raise InputError(f"element {number} of the JSON array is nested too deeply") from None
    except ValueError:
        raise InputError(f"element {number} of the JSON array is not valid JSON") from None
    if _past(_BLANK, text, end) < len(text):
        raise InputError(f"expected ',' or ']' after element {number} of the JSON array")
    return value


class Input:
    """INPUT: a file path, or ``-`` for standard input. Anything but a regular file (stdin, a
    pipe, ``/dev/stdin``, a named FIFO) is copied to a temporary file first, as it can be read
    only once; the input is read several times (its identity, its count, its entries).
    Iterating yields Entries; ``count()`` checks the whole input."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path: Path | None = None
        self._spool = _spooled(sys.stdin.buffer, name) if name == "-" else self._opened(Path(name))
        self.is_array = self._first_significant_byte() == b"["

    def _opened(self, path: Path) -> IO[bytes] | None:
        """Open ``path`` once: a regular file is kept as ``path`` (None), anything else spooled."""
        try:
            with path.open("rb") as stream:
                if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                    return _spooled(stream, self.name)
        except OSError as exc:
            raise InputError(f"cannot read {self.name}: {exc.strerror or exc}") from None
        self.path = path
        return None

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()

    def _open(self) -> AbstractContextManager[IO[bytes]]:
        if self._spool is not None:
            self._spool.seek(0)
            return nullcontext(self._spool)
        assert self.path is not None
        try:
            return self.path.open("rb")
        except OSError as exc:
            raise InputError(f"cannot read {self.name}: {exc.strerror or exc}") from None

    def _first_significant_byte(self) -> bytes:
        with self._open() as stream:
            head = stream.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()
            while not head:
                chunk = stream.read(4096)
                if not chunk:
                    return b""
                head = chunk.lstrip()
            return head[:1]

    def __iter__(self) -> Iterator[Entry]:
        with self._open() as stream:
            yield from _ArrayReader(stream) if self.is_array else _read_lines(stream)

    def identity(self) -> dict[str, str]:
        """What a journal records of this input: name, size, SHA-256 and number of entries."""
        digest = hashlib.sha256()
        size = 0
        with self._open() as stream:
            for block in iter(lambda: stream.read(2**20), b""):
                digest.update(block)
                size += len(block)
        return {
            "input": self.name if self.path is None else str(self.path.resolve()),
            "size": str(size),
            "sha256": digest.hexdigest(),
            "entries": str(self.count()),
        }

    def count(self) -> int:
        """The number of entries; reads the whole input, so a broken JSON array fails here."""
        return sum(1 for _ in self)


TABLE_FORMATS = ("csv", "tsv", "jsonl")
_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv"}


def table_format(name: str, given: str = "auto") -> str:
    """How a table INPUT is read: as given, else by its suffix (.csv; .tsv or .tab), else as
    JSON records (one object per line, or a JSON array of objects) — stdin too."""
    if given != "auto":
        return given
    return _SUFFIXES.get(Path(name).suffix.lower(), "jsonl") if name != "-" else "jsonl"


class TableInput(Input):
    """INPUT read as a table (CSV/TSV with a header row, or JSON records), each row turned by
    ``template`` into a request item: its Entry is that item, or the row (for the failed file)
    and the field it lacks. Rows are read and expanded one at a time. A template that sends
    the row as the body takes JSON records only: a CSV cell's type cannot be told."""

    def __init__(self, name: str, template: Template, form: str = "auto") -> None:
        super().__init__(name)
        self.template = template
        self.form = table_format(name, form)
        if template.row_as_body and self.form != "jsonl":
            raise InputError(
                f"--row-as-body sends each row as it is, a JSON object: {name} is read as "
                f"{self.form.upper()} (its cells are text); give JSON records (one object per "
                "line), or build each body from the columns with --body-template"
            )
        if self.form == "jsonl":
            first = self._first_significant_byte()
            if first not in (b"{", b"[", b""):
                raise InputError(
                    f"--url needs a table: {name} is neither CSV/TSV (by its suffix .csv, .tsv "
                    "or .tab, or --input-format) nor JSON records (one object per line)"
                )
        else:
            self._check_header()

    @contextlib.contextmanager
    def _csv(self) -> Iterator[Iterator[list[str]]]:
        """The CSV/TSV reader of the input's rows (its stream left open)."""
        with self._open() as stream:
            text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
            try:
                yield csv.reader(text, dialect="excel-tab" if self.form == "tsv" else "excel")
            finally:
                text.detach()

    def _rows(self) -> Iterator[tuple[str, Any]]:
        """(where, row) for each row: a JSON record's Entry, or a CSV/TSV row's (header,
        fields); InputError when it cannot be read."""
        if self.form == "jsonl":
            yield from ((entry.where, entry) for entry in super().__iter__())
            return
        with self._csv() as reader:
            number = 0
            try:
                header = next(reader)
                for fields in reader:
                    if fields:  # (not a blank line)
                        number += 1
                        yield f"row {number}", (header, fields)
            except csv.Error as exc:
                raise InputError(f"{self.name}: row {number + 1} cannot be read: {exc}") from None
            except UnicodeDecodeError as exc:
                raise InputError(f"{self.name} is not UTF-8 text: {exc.reason}") from None

    def _check_header(self) -> None:
        """InputError unless the first row is a header naming every field the template needs."""
        with self._csv() as reader:
            try:
                header = next(reader, None)
            except (csv.Error, UnicodeDecodeError) as exc:
                raise InputError(f"the header row of {self.name} cannot be read: {exc}") from None
        if not header:
            raise InputError(
                f"{self.name} has no header row: a {self.form.upper()} table "
                "needs one naming its columns"
            )
        if len(set(header)) != len(header):
            raise InputError(f"the header row of {self.name} names a column twice")
        needed = [*self.template.fields, *filter(None, [self.template.id_field])]
        for field in needed:
            if field not in header:
                raise InputError(
                    f"the template names {{{field}}}, but the header row of {self.name} has no "
                    "such column (is its first row a header?)"
                )

    def __iter__(self) -> Iterator[Entry]:
        for where, row in self._rows():
            yield self._entry(where, row)

    def _entry(self, where: str, row: Any) -> Entry:
        if isinstance(row, Entry):  # a JSON record, or a line that is none
            if row.problem is not None:
                return row
            if not isinstance(row.item, dict):
                return Entry(where, row.item, "a record must be a JSON object")
            row = row.item
        else:
            header, fields = row
            if len(fields) > len(header):
                return Entry(where, None, f"{len(fields)} fields, the header names {len(header)}")
            # An empty cell is no value, as pandas reads it (NaN).
            row = {name: value for name, value in zip(header, fields, strict=False) if value}
        try:
            return Entry(where, self.template.expand(row))
        except RowError as exc:
            return Entry(where, row, str(exc))

    def count(self) -> int:
        """The number of rows, read without building their requests."""
        return sum(1 for _ in self._rows())

    def identity(self) -> dict[str, str]:
        """The input's identity and the template's: resuming with other template options
        would pair stored Results with other requests."""
        return super().identity() | {"template": f"{self.form} {self.template.identity()}"}
