"""Output files: what is written for each Result and failed item, and writing files atomically."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .inputs import Entry
from .redact import Secrets, redact_url
from .result import Result
from .spec import InvalidItem, parse_item


def output_paths(prefix: str) -> tuple[Path, Path]:
    """The results and failed files for an output prefix."""
    return Path(f"{prefix}-results.jsonl"), Path(f"{prefix}-failed.jsonl")


def public_record(result: Result) -> dict[str, Any]:
    """A Result as written out: its dict form with any URL password masked."""
    record = result.to_dict()
    if result.url:
        record["url"] = redact_url(result.url)
    return record


def failed_request(entry: Entry, secrets: Secrets) -> dict[str, Any]:
    """The request object that re-runs a failed entry: valid INPUT, without secret headers.

    Batch-wide ``-H`` headers are never part of it; an item's own secret headers
    (Authorization, Cookie, Proxy-Authorization and any declared secret) are dropped too.
    An entry that was not a valid item is written back as given, so that it is not lost.
    """
    if entry.problem is None:
        try:
            spec = parse_item(entry.item)
        except InvalidItem:
            pass
        else:
            request = spec.to_item()
            request["url"] = redact_url(spec.url)
            headers = secrets.public(spec.headers)
            if headers:
                request["headers"] = headers
            else:
                request.pop("headers", None)
            return request
    if isinstance(entry.item, Mapping):
        request = dict(entry.item)
        if isinstance(request.get("headers"), Mapping):
            request["headers"] = secrets.public(request["headers"])
        if isinstance(request.get("url"), str):
            request["url"] = redact_url(request["url"])
        return request
    return {"url": redact_url(str(entry.item))}


@contextlib.contextmanager
def atomic_files(*paths: Path) -> Iterator[list[IO[str]]]:
    """Write to temporary files beside ``paths``; rename them over ``paths`` only once every
    one is written and synced, so a failure (a full disk) replaces none of them."""
    # Plain exclusive opens, so the files get the usual permissions (umask), not 0600.
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    temporaries = [path.with_name(f".{path.name}.{token}.tmp") for path in paths]
    try:
        with contextlib.ExitStack() as stack:
            handles: list[IO[str]] = [
                stack.enter_context(temporary.open("x", encoding="utf-8"))
                for temporary in temporaries
            ]
            yield handles
            for handle in handles:
                handle.flush()
                os.fsync(handle.fileno())
        for temporary, path in zip(temporaries, paths, strict=True):
            temporary.replace(path)
    except BaseException:
        for temporary in temporaries:
            with contextlib.suppress(OSError):
                temporary.unlink()
        raise


def write_outputs(prefix: str, rows: Iterable[tuple[str, str | None]]) -> tuple[Path, Path]:
    """Write both output files from (result JSON, failed request JSON or None) rows in order."""
    results_path, failed_path = output_paths(prefix)
    with atomic_files(results_path, failed_path) as (results, failed):
        for record, request in rows:
            results.write(record)
            results.write("\n")
            if request is not None:
                failed.write(request)
                failed.write("\n")
    return results_path, failed_path


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
