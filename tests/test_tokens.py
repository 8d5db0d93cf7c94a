"""Tokens of a language-model request: estimated from its body before it is sent (the OpenAI
cookbook's rule), and read from its answer's usage after."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from batchsync.limits import tokens
from batchsync.limits.tokens import estimate_tokens, usage_tokens


@pytest.fixture(autouse=True)
def _no_tiktoken(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Text counts by its characters unless a test installs a tiktoken of its own: the
    expected numbers below do not depend on whether tiktoken happens to be installed."""
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken fails
    tokens._encoding.cache_clear()
    yield
    tokens._encoding.cache_clear()


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": list(messages), **fields}


USER = {"role": "user", "content": "Hello, world!"}  # "user" 1 token, 13 characters 4
FRAMING = 4 + 2  # one message's framing and the reply's priming


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # OpenAI Chat Completions: role + content text, 4 a message, 2 for the reply.
        (chat(USER), 1 + 4 + FRAMING),
        (chat(USER, max_tokens=100), 1 + 4 + FRAMING + 100),
        (chat(USER, max_tokens=10, n=3), 1 + 4 + FRAMING + 30),
        (chat(USER, max_completion_tokens=50), 1 + 4 + FRAMING + 50),
        # (both named: servers differ in which they obey, so the larger counts)
        (chat(USER, max_tokens=10, max_completion_tokens=50), 1 + 4 + FRAMING + 50),
        (chat(USER, max_tokens=50, max_completion_tokens=10), 1 + 4 + FRAMING + 50),
        (chat(USER, max_output_tokens=20), 1 + 4 + FRAMING + 20),
        (
            chat(
                {"role": "system", "content": "Be brief."},  # 6 characters a token: 2 + 3
                {"role": "user", "name": "ada", "content": "abcde"},  # 1 + 1 + 2
                {"role": "assistant", "content": "ok"},  # 3 + 1
            ),
            2 + 3 + 1 + 1 + 2 + 3 + 1 + 3 * 4 + 2,
        ),
        # A message's content as parts: their text only, not an image's data.
        (
            chat(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this image?"},  # 22 characters
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64," + "A" * 4000},
                        },
                    ],
                },
                max_tokens=300,
            ),
            1 + 6 + FRAMING + 300,
        ),
        # An assistant's tool call with no content, then the tool's answer.
        (
            chat(
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1"}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
            ),
            3 + 1 + 1 + 2 * 4 + 2,
        ),
        (chat(), 2),  # no messages: the reply's priming
        # Anthropic Messages: the top-level system too, a string or text blocks.
        (
            {
                "model": "claude-sonnet-4-5",
                "max_tokens": 1024,
                "system": "You are terse.",  # 14 characters
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            },
            4 + 1 + 1 + FRAMING + 1024,
        ),
        (
            {
                "max_tokens": 64,
                "system": [
                    {"type": "text", "text": "abcdefgh"},
                    {"type": "text", "text": "ijkl", "cache_control": {"type": "ephemeral"}},
                ],
                "messages": [{"role": "user", "content": "x"}],
            },
            2 + 1 + 1 + 1 + FRAMING + 64,
        ),
        # A tool result's own content blocks, nested in the message's.
        (
            {
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_01",
                                "content": [{"type": "text", "text": "15 degrees"}],
                            }
                        ],
                    }
                ],
            },
            1 + 3 + FRAMING + 8,
        ),
        # Embeddings: a string, strings, token arrays (each id one token).
        ({"model": "text-embedding-3-small", "input": "The food was delicious"}, 6),
        ({"input": ["abc", "defgh", ""]}, 1 + 2 + 0),
        ({"input": [101, 2023, 2003, 102]}, 4),
        ({"input": [[101, 2023], [2003], []]}, 3),
        # Legacy completions: a prompt, or several, each with its own completions.
        ({"prompt": "Say this is a test", "max_tokens": 7}, 5 + 7),
        ({"prompt": ["abcd", "efgh"], "max_tokens": 5, "n": 2}, 1 + 1 + 5 * 2 * 2),
        # best_of completions are made (and billed) for each prompt, n of them returned.
        ({"prompt": "abcd", "max_tokens": 5, "n": 2, "best_of": 4}, 1 + 5 * 4),
        ({"prompt": [1, 2, 3], "max_tokens": 5}, 3 + 5),  # one prompt as a token array
        ({"prompt": [[1, 2], [3]], "max_tokens": 5}, 3 + 5 * 2),
        ({"prompt": [], "max_tokens": 5}, 5),
        # The Responses API: input as messages, max_output_tokens.
        (
            {"input": [{"role": "user", "content": "abcd"}], "max_output_tokens": 50},
            1 + 1 + 50,
        ),
        ({"input": "abcdefgh", "max_output_tokens": 50}, 2 + 50),
    ],
)
def test_the_tokens_a_request_body_will_be_charged(body: dict[str, Any], expected: int) -> None:
    assert estimate_tokens(body) == expected


@pytest.mark.parametrize(
    "body",
    [
        None,
        "Hello",
        5,
        [USER],
        {},
        {"model": "gpt-4o-mini"},
        {"max_tokens": 100},  # an allowance with no prompt: no such body
        {"messages": "Hello"},
        {"messages": None, "input": None, "prompt": 7},
        {"input": {"text": "Hello"}},
    ],
)
def test_what_is_no_request_body_costs_nothing(body: object) -> None:
    assert estimate_tokens(body) == 0


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # Only mappings are messages; only strings are text.
        (chat(None, 5, "hello", {"role": 5, "content": {"text": 7}}), 4 + 2),  # type: ignore[arg-type]
        (chat({"content": [None, 3, ["abcd"], {"text": None}]}), 1 + FRAMING),
        ({"messages": [USER], "system": 12}, 1 + 4 + FRAMING),
        # An allowance that is no count is none; the next one named is taken.
        (chat(USER, max_tokens=True), 1 + 4 + FRAMING),
        (chat(USER, max_tokens=-1, max_completion_tokens=9), 1 + 4 + FRAMING + 9),
        (chat(USER, max_tokens="100"), 1 + 4 + FRAMING),
        (chat(USER, max_tokens=10.0), 1 + 4 + FRAMING),
        # A number of choices that is none counts as one.
        (chat(USER, max_tokens=10, n=0), 1 + 4 + FRAMING + 10),
        (chat(USER, max_tokens=10, n="2"), 1 + 4 + FRAMING + 10),
        (chat(USER, max_tokens=10, n=True), 1 + 4 + FRAMING + 10),
        ({"input": [True, None, 1.5, "abcd", [1, True, "x"]]}, 1 + 1),
        # Deeper than any real content: not walked.
        (chat({"content": [[[[[[[[[[["abcd"]]]]]]]]]]]}), FRAMING),
    ],
)
def test_odd_shapes_count_what_is_text(body: dict[str, Any], expected: int) -> None:
    assert estimate_tokens(body) == expected


class _WordEncoding:
    """A stand-in for a tiktoken encoding: a token a word; refuses what it is told to."""

    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.special: list[object] = []

    def encode(self, text: str, *, disallowed_special: object = "all") -> list[int]:
        self.special.append(disallowed_special)
        if self.refuse and self.refuse in text:
            raise ValueError("refused")
        return [len(word) for word in text.split()]


def install_tiktoken(monkeypatch: pytest.MonkeyPatch, get_encoding: Any) -> None:
    module = types.ModuleType("tiktoken")
    module.get_encoding = get_encoding  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", module)
    tokens._encoding.cache_clear()


def test_tiktoken_counts_the_text_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    encoding, asked = _WordEncoding(), []

    def get_encoding(name: str) -> _WordEncoding:
        asked.append(name)
        return encoding

    install_tiktoken(monkeypatch, get_encoding)
    body = chat({"role": "user", "content": "a much longer sentence of words <|endoftext|>"})
    assert estimate_tokens(body) == 1 + 7 + FRAMING
    assert estimate_tokens({"input": ["one two", "three"], "max_tokens": 1}) == 3 + 1
    assert asked == ["cl100k_base"]  # loaded once
    # Text that looks like a special token is counted, not refused.
    assert set(encoding.special) == {()}


def test_a_tiktoken_that_cannot_load_its_table_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its table is fetched over the network the first time: offline, counting characters."""

    def get_encoding(name: str) -> _WordEncoding:
        raise ConnectionError("no network")

    install_tiktoken(monkeypatch, get_encoding)
    assert estimate_tokens(chat(USER)) == 1 + 4 + FRAMING


def test_text_tiktoken_refuses_counts_by_its_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    install_tiktoken(monkeypatch, lambda name: _WordEncoding(refuse="odd"))
    assert estimate_tokens({"input": ["two words", "an odd one"]}) == 2 + 3


def test_without_tiktoken_text_counts_4_characters_a_token() -> None:
    assert [estimate_tokens({"input": "x" * size}) for size in (0, 1, 4, 5, 8, 9)] == [
        0,
        1,
        1,
        2,
        2,
        3,
    ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
FIELDS = ["messages", "system", "input", "prompt", "max_tokens", "max_completion_tokens", "n"]
request_like = st.dictionaries(st.sampled_from([*FIELDS, "role", "content", "text"]), json_values)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(json_values | request_like)
def test_any_json_value_has_an_estimate(body: object) -> None:
    estimate = estimate_tokens(body)
    assert isinstance(estimate, int)
    assert estimate >= 0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.text(max_size=40), max_size=5), st.integers(0, 10_000), st.integers(1, 5))
def test_the_allowance_adds_to_the_prompt(texts: list[str], limit: int, n: int) -> None:
    messages = [{"role": "user", "content": text} for text in texts]
    prompt = estimate_tokens(chat(*messages))
    assert estimate_tokens(chat(*messages, max_tokens=limit, n=n)) == prompt + limit * n
    assert prompt >= sum(len(text) for text in texts) / 4


# The answers' bodies as the providers document them.
OPENAI_CHAT = {
    "id": "chatcmpl-A652Fhuqsr1kskKe5B63M0eiw3842",
    "object": "chat.completion",
    "created": 1726012687,
    "model": "gpt-4-0613",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "This is a test!", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18},
    "system_fingerprint": None,
}
ANTHROPIC_MESSAGE = {
    "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "Hi! My name is Claude."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 2095, "output_tokens": 503},
}
OPENAI_EMBEDDING = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.0023064255, -0.009327292]}],
    "model": "text-embedding-3-small",
    "usage": {"prompt_tokens": 8, "total_tokens": 8},
}


@pytest.mark.parametrize(
    ("data", "used"),
    [
        (OPENAI_CHAT, 18),
        (ANTHROPIC_MESSAGE, 2095 + 503),
        (OPENAI_EMBEDDING, 8),
        ({"usage": {"input_tokens": 10, "output_tokens": 0}}, 10),
        ({"usage": {"input_tokens": 10}}, 10),  # either of a pair alone
        ({"usage": {"output_tokens": 7}}, 7),
        ({"usage": {"prompt_tokens": 13, "completion_tokens": 5}}, 18),
        ({"usage": {"completion_tokens": 5}}, 5),
        # The Responses API: all three; the total wins.
        ({"usage": {"input_tokens": 36, "output_tokens": 87, "total_tokens": 123}}, 123),
        # A count that is none is left out.
        ({"usage": {"total_tokens": "18", "prompt_tokens": 13, "completion_tokens": 5}}, 18),
        ({"usage": {"total_tokens": -1, "input_tokens": 3, "output_tokens": 4}}, 7),
        ({"usage": {"input_tokens": True, "output_tokens": 4}}, 4),
        ({"usage": {"input_tokens": 2.5, "output_tokens": 4}}, 4),
        ({"usage": {"input_tokens": None, "prompt_tokens": 9}}, 9),
        ({"usage": {"total_tokens": True}}, None),
        ({"usage": {"total_tokens": 1.0}}, None),
        ({"usage": {}}, None),
        ({"usage": None}, None),
        ({"usage": 18}, None),
        ({"usage": "18"}, None),
        ({}, None),
        ({"choices": []}, None),
        (None, None),
        ("usage", None),
        (18, None),
        ([OPENAI_CHAT], None),
    ],
)
def test_the_tokens_an_answer_says_it_used(data: object, used: int | None) -> None:
    assert usage_tokens(data) == used


def test_an_openai_sdk_return_value_is_read_by_attribute() -> None:
    assert usage_tokens(ChatCompletion.model_validate(OPENAI_CHAT)) == 18
    assert usage_tokens(CreateEmbeddingResponse.model_validate(OPENAI_EMBEDDING)) == 8
    streamed = ChatCompletion.model_validate({**OPENAI_CHAT, "usage": None})
    assert usage_tokens(streamed) is None


def test_an_anthropic_sdk_return_value_is_read_by_attribute() -> None:
    anthropic_types = pytest.importorskip("anthropic.types")
    message = anthropic_types.Message.model_validate(ANTHROPIC_MESSAGE)
    assert usage_tokens(message) == 2095 + 503


class _Broken:
    @property
    def usage(self) -> object:
        raise RuntimeError("no usage")


class _Dumped:
    """An object whose fields are only its ``model_dump()``."""

    def __init__(self, dumped: object) -> None:
        self.dumped = dumped

    def model_dump(self) -> object:
        if isinstance(self.dumped, Exception):
            raise self.dumped
        return self.dumped


class _BrokenCount:
    total_tokens = property(lambda self: 1 // 0)
    input_tokens = 5


@pytest.mark.parametrize(
    ("data", "used"),
    [
        (types.SimpleNamespace(usage=types.SimpleNamespace(total_tokens=42)), 42),
        (types.SimpleNamespace(usage=types.SimpleNamespace(input_tokens=4, output_tokens=2)), 6),
        (types.SimpleNamespace(usage={"total_tokens": 11}), 11),  # a mapping on an object
        (types.SimpleNamespace(usage=None), None),
        (types.SimpleNamespace(), None),
        (_Dumped({"usage": {"total_tokens": 9}}), 9),
        (_Dumped({"choices": []}), None),
        (_Dumped(None), None),
        (_Dumped(RuntimeError("cannot dump")), None),
        (_Broken(), None),
        (types.SimpleNamespace(usage=_BrokenCount()), None),
    ],
)
def test_any_object_is_read_and_never_raises(data: object, used: int | None) -> None:
    assert usage_tokens(data) == used


@settings(max_examples=300, deadline=None, derandomize=True)
@given(json_values | st.dictionaries(st.just("usage"), json_values))
def test_any_json_value_says_a_count_or_none(data: object) -> None:
    used = usage_tokens(data)
    assert used is None or (type(used) is int and used >= 0)
