from __future__ import annotations

import base64

import pytest
from pydantic import BaseModel

from batchsync.decode import InvalidBody, charset_of, decode_body


class Product(BaseModel):
    sku: str
    price: float


def test_json_is_the_default() -> None:
    assert decode_body(bytearray(b'{"a": [1, 2]}'), "json", "application/json") == {"a": [1, 2]}


def test_broken_json_is_an_invalid_body() -> None:
    with pytest.raises(InvalidBody, match="not JSON"):
        decode_body(b'{"truncated": ', "json", None)


def test_text_uses_the_declared_charset() -> None:
    body = "héllo".encode("latin-1")
    assert decode_body(body, "text", "text/plain; charset=ISO-8859-1") == "héllo"
    assert decode_body("héllo".encode(), "text", "text/plain") == "héllo"


def test_bytes_come_back_as_base64_text() -> None:
    body = bytes(range(256))
    assert base64.b64decode(decode_body(body, "bytes", None)) == body


def test_a_model_validates_the_json_body() -> None:
    product = decode_body(b'{"sku": "a1", "price": 9.5}', Product, None)
    assert product == Product(sku="a1", price=9.5)


def test_a_model_mismatch_names_the_field() -> None:
    with pytest.raises(InvalidBody, match=r"Product: price: Input should be a valid number"):
        decode_body(b'{"sku": "a1", "price": "cheap"}', Product, None)


@pytest.mark.parametrize(
    ("header", "charset"),
    [
        (None, "utf-8"),
        ("application/json", "utf-8"),
        ("text/plain; charset=latin-1", "iso8859-1"),
        ('text/html; charset="UTF-8"', "utf-8"),
        ("text/plain; charset=klingon", "utf-8"),
    ],
)
def test_charset_of(header: str | None, charset: str) -> None:
    assert charset_of(header) == charset
