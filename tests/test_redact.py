"""The masking of secrets in texts: by shape, and by value in every form a message holds one."""

from __future__ import annotations

import base64
import json
import logging
from urllib.parse import quote, quote_plus

import pytest

from batchsync.core.redact import MASK, SECRET_PARAMS, RedactingFilter, Secrets, watching

TOKEN = "tok3n-Zq9/+x=Yw"
RUN = Secrets.of({"Authorization": f"Bearer {TOKEN}"}, declared=["X-Session"], params=["My_Sig"])


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@h.test/x", "http://***@h.test/x"),
        ("http://sk_live_abc@h.test/x", "http://***@h.test/x"),  # a key as the user name
        ("http://u:PW@127.0.0.1:99999/", "http://***@127.0.0.1:99999/"),  # bad port
        ("http://u:PW@[::1/", "http://***@[::1/"),  # cannot be split at all
        ("https://h.test/a@b/c?x=1", "https://h.test/a@b/c?x=1"),  # an @ in the path
        ("http://h.test/?api_key=K1&page=2", "http://h.test/?api_key=***&page=2"),
        ("http://h.test/?Access_Token=K1#f", "http://h.test/?Access_Token=***#f"),
        ("http://h.test/?keyboard=qwerty&key=", "http://h.test/?keyboard=qwerty&key=***"),
        ("http://h.test/?my_sig=S&MY_SIG=T", "http://h.test/?my_sig=***&MY_SIG=***"),
        ("http://h.test/x;sig=S", "http://h.test/x;sig=***"),
        ("http://h.test/plain", "http://h.test/plain"),
    ],
)
def test_urls_are_masked_by_shape(url: str, shown: str) -> None:
    assert RUN.url(url) == shown


def test_every_default_secret_parameter_is_masked() -> None:
    for name in SECRET_PARAMS:
        assert (
            Secrets().url(f"http://h.test/?{name.upper()}=v4lue")
            == f"http://h.test/?{name.upper()}=***"
        )


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        ("http://h.test/?api%5Fkey=PCTNAME1", "PCTNAME1"),  # requests sends it as api_key
        ("http://h.test/?%74oken=PCTNAME2", "PCTNAME2"),
        ("http://h.test/?x=1#access_token=FRAGMENT1", "FRAGMENT1"),
        ("http://h.test/?api_key[]=BRACKET1&token+=PLUSNAME1", "BRACKET1 PLUSNAME1"),
        ("http://user:ATA0A@ATB34F5@h.test/", "ATA0A ATB34F5"),  # an @ in the password
        ("redis://ruser:RPW1@RPW2@127.0.0.1:1/0", "RPW1 RPW2"),
        ("http://user:ab\"QUOTEPW'<9>@h.test/", "QUOTEPW"),
        ("http://h.test/r?to=http://o.test/ok%3Fapi_key%3DNESTED123", "NESTED123"),
        ("http://h.test/r?to=http://o.test/ok?api_key=NESTED456", "NESTED456"),
        ("http://h.test/?api_key=QMARK1?QMARK2", "QMARK1 QMARK2"),
    ],
)
def test_shapes_a_server_reads_as_secrets_are_masked(text: str, hidden: str) -> None:
    masked = RUN.text(f"failed {text}: HTTP 404")
    for value in hidden.split():
        assert value not in masked, masked


@pytest.mark.parametrize(
    ("url", "shown"),
    [  # a URL escaped into another's query (a next page's server, a callback): its userinfo
        ("http://h.test/p?base=http%3A%2F%2Fpg%3ANESTEDPW1%40h.test%3A81&x=1",
         "http://h.test/p?base=http%3A%2F%2F***%40h.test%3A81&x=1"),
        ("http://h.test/p?to=https%3a%2f%2fab%3Ac%40d%40o.test%2Fx%40y",  # the last %40 of it
         "http://h.test/p?to=https%3a%2f%2f***%40o.test%2Fx%40y"),
        ("http://h.test/p?to=http%3A%2F%2Fo.test%2Fa%40b", "http://h.test/p?to=http%3A%2F%2Fo.test%2Fa%40b"),
        ("http://h.test/a%40b?c=%2F%2Fd", "http://h.test/a%40b?c=%2F%2Fd"),
    ],
)  # fmt: skip
def test_userinfo_of_a_url_escaped_into_another_is_masked(url: str, shown: str) -> None:
    assert Secrets().url(url) == shown
    assert RUN.text(f"page 2 ({url}): HTTP 503") == f"page 2 ({shown}): HTTP 503"


def test_basic_auth_from_userinfo_is_masked_whatever_the_lengths() -> None:
    for user in ("u", "us", "use", "user", "users"):
        own = RUN.of_item([f"http://{user}:B64secret9@h.test/"], None, None)
        sent = base64.b64encode(f"{user}:B64secret9".encode()).decode()
        assert RUN.text(f"BadStatusLine('Basic {sent}')", own) == "BadStatusLine('Basic ***')"


def test_a_url_with_nothing_to_mask_is_the_same_object() -> None:
    url = "http://h.test/items/1"
    assert Secrets().url(url) is url  # the fast lane's cost: two `in` tests


@pytest.mark.parametrize(
    "form",
    [
        TOKEN,
        f"Bearer {TOKEN}",
        json.dumps(TOKEN)[1:-1],
        repr(f"Bearer {TOKEN}\r\n"),
        repr(f"Bearer {TOKEN}".encode()),
        quote(TOKEN, safe=""),
        quote_plus(TOKEN),
        base64.b64encode(TOKEN.encode()).decode(),
    ],
)
def test_a_known_value_is_masked_in_every_form(form: str) -> None:
    masked = RUN.text(f"failed: {form} (end)")
    assert "tok3n" not in masked and "dG9rM2" not in masked, masked
    assert MASK in masked


@pytest.mark.parametrize("cut", ["…", "..."])
def test_a_value_cut_short_is_masked_at_the_cut(cut: str) -> None:
    assert "tok3n-Zq" not in RUN.text(f"header value b'Bearer tok3n-Zq9{cut}' is invalid")
    assert "9/+x=Yw" not in RUN.text(f"ends with {cut}Zq9/+x=Yw")
    assert RUN.text(f"a sentence that trails off{cut}") == f"a sentence that trails off{cut}"


def test_an_items_own_values_are_masked_with_the_runs() -> None:
    own = RUN.of_item(
        ["http://alice:s3cr3tpw@h.test/?token=t0k3nvalue&page=2"],
        {"Cookie": "sid=c00kie-value", "X-Session": "sess10n-id", "Accept": "text/html"},
        {"access_token": "paramvalue", "page": 2},
    )
    assert own == {
        "alice",
        "s3cr3tpw",
        "alice:s3cr3tpw",
        "t0k3nvalue",
        "sid=c00kie-value",
        "sess10n-id",
        "paramvalue",
    }
    text = "s3cr3tpw t0k3nvalue c00kie-value sess10n-id paramvalue text/html page 2"
    assert RUN.text(text, own) == f"{MASK} {MASK} {MASK} {MASK} {MASK} text/html page 2"


def test_the_auth_scheme_is_no_secret() -> None:
    assert RUN.text("the Bearer token was refused") == "the Bearer token was refused"
    assert RUN.text(f"Authorization: Bearer {TOKEN}") == "Authorization: ***"


def test_short_values_are_masked_by_shape_only() -> None:
    # A user name "u" masked by value would mask every "u" of every message.
    assert RUN.of_item(["http://u:pw@h.test/"], None, None) == {"u:pw"}
    assert (
        RUN.text("url: not a valid URL: http://u:pw@h.test/")
        == "url: not a valid URL: http://***@h.test/"
    )


def test_the_log_filter_masks_records_of_batchsync_and_urllib3(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG), watching(RUN):
        logging.getLogger("batchsync").info("sending %s", f"Bearer {TOKEN}")
        logging.getLogger("urllib3.connectionpool").debug('"GET /?api_key=K1 HTTP/1.1" 200 2')
        try:
            raise ValueError(f"bad header {TOKEN!r}")
        except ValueError:
            logging.getLogger("batchsync").exception("failed")
    assert "tok3n" not in caplog.text and "K1" not in caplog.text
    assert "sending ***" in caplog.text and "api_key=***" in caplog.text
    assert isinstance(logging.getLogger("batchsync").filters[0], RedactingFilter)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "http://user:passwd@h.test/basic-auth/user/passwd",
            "http://***@h.test/basic-auth/user/passwd",
        ),
        ("http://user:passwd@h.test/useronly?q=users", "http://***@h.test/useronly?q=users"),
        ("http://h.test/a/sk1234/b?api_key=sk1234", "http://h.test/a/sk1234/b?api_key=***"),
        # (a value of 8 characters or more does not turn up by chance: masked wherever it is)
        ("http://h.test/a/sk12345x/b?api_key=sk12345x", "http://h.test/a/***/b?api_key=***"),
    ],
)
def test_a_short_value_is_masked_only_where_it_stands_as_that_secret(url: str, shown: str) -> None:
    own = RUN.of_item([url], None, None)
    assert RUN.text(url, own) == shown


def test_a_short_value_is_still_masked_as_a_word_in_a_message() -> None:
    own = RUN.of_item(["http://user:passwd@h.test/"], {"X-Session": "k3y"}, {"key": "abc12"})
    basic = base64.b64encode(b"user:passwd").decode()
    message = f"BadStatusLine('user passwd, Basic {basic}, key=abc12%26x, X-Api: abc12')"
    assert RUN.text(message, own) == "BadStatusLine('*** ***, Basic ***, key=***%26x, X-Api: ***')"
    assert RUN.text("to /x%3Fq%3Dabc12 and userabc12", own) == "to /x%3Fq%3D*** and userabc12"


def test_the_resume_line_keeps_template_fields_and_masks_values() -> None:
    # (with api_key=*** the printed command was refused: it names another template)
    from batchsync.cli.command import command
    from batchsync.cli.options import resume_command

    argv = ["rows.csv", "--url", "https://h.test/{id}?api_key={tok}&token=l1teral-k3y&key={{x}}"]
    assert resume_command(argv, RUN, command.params).line == (
        "python -m batchsync rows.csv --url "
        "'https://h.test/{id}?api_key={tok}&token=***&key=***' --resume"
    )


def test_log_records_reach_a_terminal_with_control_characters_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # (a server's Link target, shown in "-v" as "page 2 (…)", may hold ESC and BEL)
    with caplog.at_level(logging.DEBUG), watching(RUN):
        logging.getLogger("batchsync").info("page 2 (%s): HTTP 503", "http://h.test/\x1b]0;x\x07")
        logging.getLogger("urllib3.connectionpool").debug("GET /\x9b2J\r\nfake line")
    assert caplog.messages == [
        "page 2 (http://h.test/\\x1b]0;x\\x07): HTTP 503",
        "GET /\\x9b2J\\x0d\\x0afake line",
    ]


def test_a_short_secret_a_server_copies_into_a_path_is_masked_a_path_written_so_is_not() -> None:
    secrets = Secrets()
    own = frozenset({"k3yab", "user", "passwd"})
    echoed = secrets.answered(
        "http://h.test/404/k3yab?x=1", own, "http://h.test/echo?api_key=k3yab"
    )
    assert echoed == "http://h.test/404/***?x=1"
    written = "http://h.test/basic-auth/user/passwd"
    assert secrets.answered(written, own, "http://u:p@h.test/basic-auth/user/passwd") == written
    assert secrets.answered("http://h.test/useronly", own, "http://h.test/x") == (
        "http://h.test/useronly"
    )
