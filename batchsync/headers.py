"""Response headers read without the email package: the same HTTPMessage at a fraction of the cost.

``http.client`` hands every response's header block to ``email.parser``, a general MIME parser
that took about a sixth of the instructions batchsync spends on a small request. The header blocks
HTTP servers send are nearly always plain ``Name: value`` lines, and for those the message is
built here directly; anything else (folded lines, malformed lines, multipart or message
bodies that the email parser treats specially) still goes through ``email.parser``, so the
result is the stdlib's in every case.
"""

from __future__ import annotations

import email.parser
import http.client
import re
import types
from collections.abc import Callable
from typing import Any, BinaryIO

# The limits http.client applies to a header block.
MAX_LINE = 65536
MAX_HEADERS = 100

# One plain header line: a name of printable ASCII (no colon), a colon, then a value without
# CR or LF. ``email``'s compat32 policy drops the spaces and tabs before the value.
_PLAIN_LINE = re.compile(rb"([!-9;-~]+):[ \t]*([^\r\n]*)\r?\n")
_END_OF_HEADERS = (b"\r\n", b"\n")
# Content types for which the email parser looks into the (empty) body and builds parts.
_SPECIAL_TYPE = re.compile(rb"multipart|message", re.IGNORECASE)


def read_header_lines(fp: BinaryIO) -> list[bytes]:
    """The header lines up to and including the blank line (or end of stream) that ends them."""
    lines = []
    while True:
        line = fp.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        if not line or line in _END_OF_HEADERS:
            return lines


class QuickMessage(http.client.HTTPMessage):
    """An HTTPMessage whose look-ups skip the email policy's value clean-up.

    compat32 hands a str value back as is unless it holds surrogates, and text decoded from
    latin-1, as every HTTP header here is, cannot hold any.
    """

    def get(self, name: str, failobj: Any = None) -> Any:
        name = name.lower()
        for key, value in self._headers:  # type: ignore[attr-defined]
            if key.lower() == name:
                return value
        return failobj

    def items(self) -> list[tuple[str, Any]]:
        return list(self._headers)  # type: ignore[attr-defined]


def message_from_lines(lines: list[bytes]) -> http.client.HTTPMessage:
    """The HTTPMessage ``email.parser`` would make of these lines, built directly if plain."""
    fields = [_PLAIN_LINE.fullmatch(line) for line in lines[:-1]]
    plain = lines[-1] in _END_OF_HEADERS and all(fields)
    if not plain or any(
        field[1].lower() == b"content-type" and _SPECIAL_TYPE.search(field[2])
        for field in fields
        if field is not None
    ):
        text = b"".join(lines).decode("iso-8859-1")
        message: http.client.HTTPMessage = email.parser.Parser(_class=QuickMessage).parsestr(text)
        return message
    message = QuickMessage()
    message._headers = [  # type: ignore[attr-defined]
        (field[1].decode("ascii"), field[2].decode("iso-8859-1"))
        for field in fields
        if field is not None
    ]
    message.set_payload("")
    return message


def parse_headers(fp: BinaryIO) -> http.client.HTTPMessage:
    """``http.client.parse_headers`` with the quick path."""
    return message_from_lines(read_header_lines(fp))


def _begin_with_quick_headers() -> Callable[[http.client.HTTPResponse], None]:
    """http.client's own ``begin``, run with ``parse_headers`` bound to this module's: the
    status line, chunking, lengths and keep-alive are decided exactly as the running Python
    decides them. On a Python whose ``begin`` is not built that way, the stdlib's as it is."""
    begin = http.client.HTTPResponse.begin
    code = begin.__code__
    if code.co_freevars or "parse_headers" not in code.co_names:
        return begin
    globals_ = {**vars(http.client), "parse_headers": parse_headers}
    return types.FunctionType(code, globals_, "begin", begin.__defaults__)


class QuickHeadersResponse(http.client.HTTPResponse):
    """An ``http.client`` response whose headers are read by ``parse_headers`` above."""

    begin = _begin_with_quick_headers()
