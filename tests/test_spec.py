from __future__ import annotations

import pytest

from batchsync.core.verdict import InvalidItem
from batchsync.http.spec import RequestSpec, item_label, parse_item


def test_a_url_string_is_a_get() -> None:
    spec = parse_item("https://api.example.test/items/1")
    assert (spec.url, spec.method, spec.headers) == (
        "https://api.example.test/items/1",
        "GET",
        None,
    )


def test_a_mapping_carries_every_field() -> None:
    spec = parse_item(
        {
            "url": "http://h.test/x",
            "method": "post",
            "headers": {"X-A": "1"},
            "params": {"q": "a b", "n": 3},
            "json": {"k": [1, 2]},
            "id": "sku-1",
            "idempotency_key": "k-1",
        }
    )
    assert spec.method == "POST"
    assert spec.json_body == {"k": [1, 2]}
    assert spec.id == "sku-1"
    assert spec.retry_safe


def test_a_request_spec_passes_through() -> None:
    spec = RequestSpec(url="http://h.test/")
    assert parse_item(spec) is spec


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("ftp://h.test/file", "scheme must be http or https"),
        ("/relative/path", "scheme must be http or https"),
        ("http://", "no host"),
        ("not a url at all", "not a valid URL"),
        ({"method": "GET"}, "url: Field required"),
        ({"url": "http://h.test", "colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"url": "http://h.test", "method": "GE T"}, "method: not one of DELETE, GET, HEAD"),
        ({"url": "http://h.test", "method": "CONNECT"}, "method: 'CONNECT' is not one of"),
        ({"url": "http://h.test", "method": "trace"}, "method: 'trace' is not one of"),
        ({"url": "http://h.test", "id": float("nan")}, "id: strict JSON cannot hold it"),
        ({"url": "http://h.test", "id": object()}, "id: strict JSON cannot hold it"),
        ("http://user:PW@127.0.0.1:99999/", "^not a valid URL: its host or port cannot be read$"),
        ("http://user:PW@[::1/", "^not a valid URL: its host or port cannot be read$"),
        ("http://h .test/", "^not a valid URL: its host or port cannot be read$"),
        ({"url": "http://h.test", "headers": {"X": 1}}, "headers.X"),
        (42, "not int"),
        (None, "not NoneType"),
    ],
)
def test_bad_items_are_refused_with_one_line(item: object, message: str) -> None:
    with pytest.raises(InvalidItem, match=message) as caught:
        parse_item(item)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("method", "key", "safe"),
    [
        ("GET", None, True),
        ("PUT", None, True),
        ("DELETE", None, True),
        ("POST", None, False),
        ("PATCH", None, False),
        ("POST", "k", True),
        ("PATCH", "k", True),
    ],
)
def test_unsafe_methods_need_an_idempotency_key(method: str, key: str | None, safe: bool) -> None:
    spec = RequestSpec(url="http://h.test", method=method, idempotency_key=key)
    assert spec.retry_safe is safe


def test_to_item_round_trips_and_keeps_only_what_was_given() -> None:
    item = {
        "url": "http://h.test/x",
        "method": "POST",
        "json": {"a": 1},
        "id": 7,
        "idempotency_key": "abc",
    }
    spec = parse_item(item)
    assert spec.to_item() == item
    assert parse_item(spec.to_item()) == spec
    assert parse_item("http://h.test/y").to_item() == {"url": "http://h.test/y"}


def test_labels_are_read_without_validation() -> None:
    assert item_label("http://h.test") == ("http://h.test", None)
    assert item_label({"url": "bad", "id": 3}) == ("bad", 3)
    assert item_label({"url": 5}) == (None, None)
    assert item_label(object()) == (None, None)
