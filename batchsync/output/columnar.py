"""Results as typed columns: CSV (RFC 4180, the csv module) and Parquet (pyarrow), written
row by row from the records the journal holds (``Result.to_dict``), in flat memory.

Columns, in this order: index int, url str, final_url str, redirects int, id str, ok bool,
status_code int, attempts int, error_kind str, error str, data str, elapsed float,
attempt_log str, fallback_used int, then pages int when the run was paginated; every column
but index, redirects, ok, attempts and elapsed may be null. ``data`` and ``attempt_log`` hold
the record's JSON text (null when ``data`` is null); ``id`` holds a string id as it is and any
other id as its JSON text. CSV writes a null as an empty cell and a bool as true/false.

``flatten``: the successes' JSON bodies are spread into ``data.…`` columns by ``flat_body``
(as ``ResultSet.to_pandas(expand=True)`` spreads them). The column set comes from a first
pass over the records: the keys in the order they first appear, at most ``MAX_COLUMNS``;
``data`` then holds what was not spread (a failure's data, the keys beyond the cap), null
when nothing was left. A column's type is the one its values share (bool, int, float when
ints and floats mix, str); a column whose values are lists, objects or of mixed kinds holds
their JSON text.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from ..core.records import dumps
from ..core.result import flat_body, utf8_text

FORMATS = ("jsonl", "csv", "parquet")
# --flatten spreads at most this many body keys into columns; the rest stay in ``data``.
MAX_COLUMNS = 1000
# A Parquet row group is written once it holds this many rows or about this many bytes.
GROUP_ROWS = 16384
GROUP_BYTES = 32 * 2**20

# (name, kind) of the fixed columns; kinds: int, float, bool, str, json (JSON text).
# (This table and the kinds' Arrow types keep a few pairs a line: they read as tables.)
FIXED = (
    ("index", "int"), ("url", "str"), ("final_url", "str"), ("redirects", "int"),
    ("id", "id"), ("ok", "bool"), ("status_code", "int"), ("attempts", "int"),
    ("error_kind", "str"), ("error", "str"), ("data", "json"), ("elapsed", "float"),
    ("attempt_log", "json"), ("fallback_used", "int"),
)  # fmt: skip
PARQUET_HINT = "pip install 'batchsync[parquet]'"


def pyarrow_missing() -> str | None:
    """Why Parquet cannot be written here (pyarrow is not installed), or None."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return f"--format parquet needs pyarrow: {PARQUET_HINT}"
    return None


_INT64 = range(-(2**63), 2**63)


# The column kind a body value asks for, by its type (another type's: JSON text).
_KINDS = ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"))


def _kind(value: Any) -> str | None:
    """The column kind a body value asks for; None for a null."""
    if value is None:
        return None
    found = next((kind for type_, kind in _KINDS if isinstance(value, type_)), "json")
    return "json" if found == "int" and value not in _INT64 else found


def _joined(old: str | None, new: str | None) -> str | None:
    if old is None or new is None or old == new:
        return old or new
    return "float" if {old, new} == {"int", "float"} else "json"


@dataclass
class Layout:
    """The columns of a results table: the fixed ones, pages, and the spread body keys."""

    paged: bool = False
    flatten: bool = False
    # Spread body key -> its column kind (None while only nulls were seen), in first-seen order.
    body: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        records: Iterable[dict[str, Any]],
        *,
        paged: bool,
        flatten: bool,
        cap: int = MAX_COLUMNS,
    ) -> Layout:
        """The layout for ``records`` (read only when ``flatten``: the first pass)."""
        layout = cls(paged, flatten)
        if flatten:
            for record in records:
                if record["ok"]:
                    for key, value in flat_body(record["data"]).items():
                        if key in layout.body or len(layout.body) < cap:
                            layout.body[key] = _joined(layout.body.get(key), _kind(value))
        return layout

    def columns(self) -> list[tuple[str, str]]:
        """(name, kind) of every column in order."""
        fixed = list(FIXED) + ([("pages", "int")] if self.paged else [])
        return fixed + [(f"data.{key}", kind or "str") for key, kind in self.body.items()]

    def row(self, record: dict[str, Any]) -> list[Any]:
        """The record's cells, in column order, each a value of its column's kind or None."""
        data, spread = self._spread(record)
        cells = [_cell(record.get(name), kind) for name, kind in FIXED[:10]]
        cells.append(None if data is None else dumps(data))
        cells.append(record["elapsed"])
        cells.append(dumps(record["attempt_log"]))
        cells.append(record["fallback_used"])
        if self.paged:
            cells.append(record.get("pages"))
        cells += [_cell(spread.get(key), kind or "str") for key, kind in self.body.items()]
        return cells

    def _spread(self, record: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The record's data, less the keys that have columns of their own; and those keys'
        values (flattened, of a success only)."""
        if not (self.flatten and record["ok"]):
            return record["data"], {}
        body = flat_body(record["data"])
        spread = {key: body.pop(key) for key in list(body) if key in self.body}
        return body or None, spread


def _cell(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "json" or (kind == "id" and not isinstance(value, str)):
        return dumps(value)
    if isinstance(value, str):
        return utf8_text(value)
    if kind == "float" or isinstance(value, float):
        number = float(value)
        return number if math.isfinite(number) else None  # (as the JSONL writes NaN: null)
    return value


def _csv_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv(handle: IO[str], layout: Layout, records: Iterable[dict[str, Any]]) -> None:
    """A header row, then one row per record (RFC 4180: CRLF, quotes where needed). Cells
    are written as they are: a text that starts with =, +, - or @ is not altered."""
    writer = csv.writer(handle, lineterminator="\r\n")
    writer.writerow([name for name, _ in layout.columns()])
    for record in records:
        writer.writerow([_csv_text(cell) for cell in layout.row(record)])


def write_parquet(handle: IO[bytes], layout: Layout, records: Iterable[dict[str, Any]]) -> None:
    """The records as a Parquet file (a row group every GROUP_ROWS rows or GROUP_BYTES)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {
        "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "str": pa.string(),
        "json": pa.string(), "id": pa.string(),
    }  # fmt: skip
    columns = layout.columns()
    schema = pa.schema(
        [pa.field(name, types[kind], nullable=name not in _REQUIRED) for name, kind in columns]
    )
    writer = pq.ParquetWriter(handle, schema)
    try:
        for group in _groups(layout, records, len(columns)):
            writer.write_table(pa.Table.from_arrays(group, schema=schema))
    finally:
        writer.close()


_REQUIRED = {"index", "redirects", "ok", "attempts", "elapsed", "attempt_log"}


def _groups(
    layout: Layout, records: Iterable[dict[str, Any]], width: int
) -> Iterator[list[list[Any]]]:
    """The records' cells a row group at a time, column by column."""
    group: list[list[Any]] = [[] for _ in range(width)]
    rows = size = 0
    for record in records:
        for column, cell in zip(group, layout.row(record), strict=True):
            column.append(cell)
            if isinstance(cell, str):
                size += len(cell)
        rows += 1
        if rows >= GROUP_ROWS or size >= GROUP_BYTES:
            yield group
            group = [[] for _ in range(width)]
            rows = size = 0
    if rows:
        yield group


def parsed(texts: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Records from their JSON texts, one at a time."""
    return map(json.loads, texts)


def write_table(
    handle: IO[Any],
    form: str,
    records: Callable[[], Iterable[dict[str, Any]]],
    *,
    paged: bool,
    flatten: bool,
) -> None:
    """Write ``records()`` (called twice with ``flatten``: each call a fresh pass) as ``form``
    (csv or parquet) to ``handle``."""
    layout = Layout.of(records(), paged=paged, flatten=flatten) if flatten else Layout(paged)
    if form == "csv":
        write_csv(handle, layout, records())
    elif form == "parquet":
        write_parquet(handle, layout, records())
    else:
        raise ValueError(f"no table format {form!r}: csv or parquet")
