"""A Result as stored and written: one line of strict JSON (the journal, the output files)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .result import Result


def public_record(result: Result) -> dict[str, Any]:
    """A Result as written out (its texts were masked when it was made)."""
    return result.to_dict()


def dumps(value: object) -> str:
    """Compact strict JSON, so that the journal and the output files hold only lines any JSON
    reader takes back: UTF-8 kept as is, except in text UTF-8 cannot encode (a lone surrogate,
    from a JSON escape such as "\\ud800"), which is written with ASCII escapes; a NaN or an
    infinity (which Python's JSON reader accepts, in a body or an input line) is written as
    null, as JavaScript's JSON.stringify does."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN or an infinity (anything else raises again, out of here)
        value = _finite(value)
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text


def _finite(value: object) -> object:
    """``value`` with every NaN and infinity replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
