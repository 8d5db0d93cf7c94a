"""Reading INPUT lazily: one item per line (a URL or a JSON object), or one JSON array.

Every entry becomes an ``Entry``: the item, or the reason it is not one (reported later as
that item's ``invalid_request`` Result, with its line number). Only an input that cannot be
read at all raises ``InputError``.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MAX_LINE_BYTES = 2**20
_ARRAY_CHUNK = 2**16
_SHOWN_CHARS = 200


class InputError(Exception):
    """The input as a whole cannot be read or parsed."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One input entry: where it stands, the item read from it, or why it is not an item."""

    where: str
    item: object
    problem: str | None = None


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _parse_line(where: str, raw: bytes) -> Entry | None:
    """The entry on one line, or None for blank lines and comments."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        shown = _shown(raw.decode("utf-8", errors="replace").strip())
        return Entry(where, shown, "not UTF-8 text")
    if not text or text.startswith("#"):
        return None
    if "\x00" in text:
        return Entry(where, _shown(text.replace("\x00", "\\0")), "contains a NUL byte")
    if not text.startswith("{"):
        return Entry(where, text)
    try:
        value = json.loads(text)
    except RecursionError:
        return Entry(where, _shown(text), "JSON nested too deeply")
    except ValueError as exc:
        return Entry(where, _shown(text), f"not valid JSON: {exc}")
    if not isinstance(value, dict):
        return Entry(where, _shown(text), "a JSON line must be an object")
    return Entry(where, value)


def _read_lines(stream: IO[bytes]) -> Iterator[Entry]:
    number = 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        where = f"line {number}"
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        if len(raw) > MAX_LINE_BYTES:
            tail = raw
            while tail and not tail.endswith(b"\n"):
                tail = stream.readline(MAX_LINE_BYTES)
            shown = _shown(raw.decode("utf-8", errors="replace"))
            yield Entry(where, shown, f"line is longer than {MAX_LINE_BYTES} bytes")
            continue
        entry = _parse_line(where, raw)
        if entry is not None:
            yield entry


class _ArrayReader:
    """The elements of a JSON array, decoded one at a time from a byte stream."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._decoder = json.JSONDecoder()
        self._text = codecs.getincrementaldecoder("utf-8-sig")()
        self._buffer = ""
        self._position = 0
        self._at_end = False

    def _more(self) -> bool:
        """Read another chunk onto what is left of the buffer; False at the end."""
        if self._at_end:
            return False
        chunk = self._stream.read(_ARRAY_CHUNK)
        self._at_end = not chunk
        try:
            text = self._text.decode(chunk, final=self._at_end)
        except UnicodeDecodeError as exc:
            raise InputError(f"the JSON array is not UTF-8 text: {exc.reason}") from None
        self._buffer = self._buffer[self._position :] + text
        self._position = 0
        return True

    def _next_char(self) -> str:
        """The next character that is not white space (it stays unread)."""
        while True:
            while self._position < len(self._buffer) and self._buffer[self._position].isspace():
                self._position += 1
            if self._position < len(self._buffer):
                return self._buffer[self._position]
            if not self._more():
                raise InputError("the JSON array ends too soon")

    def _value(self, number: int) -> Any:
        """The element starting here; reads on while it may continue past the buffer."""
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buffer, self._position)
            except RecursionError:
                raise InputError(
                    f"element {number} of the JSON array is nested too deeply"
                ) from None
            except ValueError:
                value, end = None, -1
            if end >= 0 and (end < len(self._buffer) or self._at_end):
                self._position = end
                return value
            # A number or a string may go on past what has been read: read on.
            if not self._more():
                raise InputError(f"element {number} of the JSON array is not valid JSON")
            self._next_char()

    def __iter__(self) -> Iterator[Any]:
        if self._next_char() != "[":
            raise InputError("not a JSON array")
        self._position += 1
        if self._next_char() == "]":
            return
        number = 0
        while True:
            number += 1
            self._next_char()
            yield self._value(number)
            separator = self._next_char()
            self._position += 1
            if separator == "]":
                return
            if separator != ",":
                raise InputError(f"expected ',' or ']' after element {number} of the JSON array")


class Input:
    """INPUT: a file path, or ``-`` for standard input (copied to a temporary file first, so that
    it can be read more than once). Iterating yields Entries; ``count()`` checks the whole input.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._spool: IO[bytes] | None = None
        if name == "-":
            self._spool = tempfile.TemporaryFile(prefix="batchsync-stdin-")  # noqa: SIM115
            shutil.copyfileobj(sys.stdin.buffer, self._spool)
            self.path: Path | None = None
        else:
            self.path = Path(name)
            try:
                with self.path.open("rb"):
                    pass
            except OSError as exc:
                raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
        self.is_array = self._first_significant_byte() == b"["

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
            if not self.is_array:
                yield from _read_lines(stream)
                return
            for number, value in enumerate(_ArrayReader(stream), start=1):
                yield Entry(f"element {number}", value)

    def identity(self) -> dict[str, str]:
        """What a journal records of this input: name, size, SHA-256 and number of entries."""
        digest = hashlib.sha256()
        size = 0
        with self._open() as stream:
            for block in iter(lambda: stream.read(2**20), b""):
                digest.update(block)
                size += len(block)
        name = self.name if self.path is None else str(self.path.resolve())
        return {
            "input": name, "size": str(size), "sha256": digest.hexdigest(),
            "entries": str(self.count()),
        }  # fmt: skip

    def count(self) -> int:
        """The number of entries; reads the whole input, so a broken JSON array fails here."""
        return sum(1 for _ in self)
