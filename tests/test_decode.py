from __future__ import annotations

import base64

import pytest
from pydantic import BaseModel

from batchsync.http.decode import InvalidBody, declared_encoding, decode_body


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
    assert decode_body("héllo".encode(), "text", "text/plain; charset=utf-8") == "héllo"


def test_text_without_a_charset_is_latin_1_as_in_requests() -> None:
    # requests' r.text: text/* with no charset is ISO-8859-1 (RFC 2616), UTF-8 bytes included.
    assert decode_body("héllo".encode("latin-1"), "text", "text/plain") == "héllo"
    assert decode_body("héllo".encode(), "text", "text/plain") == "hÃ©llo"


def test_json_honours_a_declared_charset() -> None:
    body = '{"name": "café"}'.encode("latin-1")
    assert decode_body(body, "json", "application/json; charset=iso-8859-1") == {"name": "café"}
    product = decode_body(b'{"sku": "\xe91", "price": 1}', Product, "text/json; charset=latin-1")
    assert product == Product(sku="é1", price=1)


def test_json_without_a_label_is_read_as_utf_8_16_or_32() -> None:
    for codec in ("utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32-be"):
        assert decode_body('{"é": 1}'.encode(codec), "json", None) == {"é": 1}


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
    ("header", "encoding"),
    [
        (None, None),
        ("application/json", "utf-8"),
        ("text/plain", "ISO-8859-1"),
        ("text/plain; charset=latin-1", "latin-1"),
        ('text/html; charset="UTF-8"', "UTF-8"),
        ("application/octet-stream", None),
    ],
)
def test_declared_encoding(header: str | None, encoding: str | None) -> None:
    assert declared_encoding(header) == encoding


def test_an_unknown_charset_reads_as_utf_8_with_errors_replaced() -> None:
    assert decode_body(b"caf\xc3\xa9 \xff", "text", "text/plain; charset=klingon") == "café \ufffd"
