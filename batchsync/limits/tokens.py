"""What a language-model request costs in tokens: estimated from its body before it is sent, and
as the provider counted it from its answer's ``usage`` afterwards.

The estimate is the OpenAI cookbook's parallel processor's: the prompt's text plus the
completion allowance. Pure functions of the body and of the answer, so that a token budget can
take an item's cost before sending it and correct it once the answer says what was used.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol, TypeGuard

from ..core.numbers import MAX_COUNT, count_of

_CHARS_PER_TOKEN = 4
# The cookbook's chat overhead: each message is framed as <im_start>{role}\n{content}<im_end>\n,
# and every reply is primed with <im_start>assistant.
_MESSAGE_OVERHEAD = 4
_REPLY_PRIMING = 2
# The completion allowance: Chat Completions' (old and new name), then the Responses API's.
_ALLOWANCES = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# What an answer's usage adds up when it gives no total: Anthropic's and OpenAI's Responses
# API's names, then Chat Completions'.
# An answer's input and output tokens: Anthropic's and OpenAI's Responses API's names, or Chat
# Completions' (an answer uses one pair); then Anthropic's cache writes and reads, input tokens
# its ``input_tokens`` leaves out.
_USAGE_INPUTS = ("input_tokens", "prompt_tokens")
_CACHE_INPUTS = ("cache_creation_input_tokens", "cache_read_input_tokens")
_USAGE_OUTPUTS = ("output_tokens", "completion_tokens")
# Deeper than any real content (message, parts, a tool result's blocks): junk is not walked.
_DEPTH = 8


class _Encoding(Protocol):
    def encode(self, text: str, *, disallowed_special: tuple[()]) -> list[int]: ...


def estimate_tokens(body: object) -> int:
    """Tokens an LLM request body (a JSON mapping as sent) will be charged, before it is sent.

    The prompt: the text of ``messages`` (each message's role, name and content text, a string
    or parts with ``"text"``, plus 4 tokens a message and 2 for the reply, as the cookbook
    counts) with Anthropic's top-level ``system``; or ``input`` (a string, strings, token
    arrays of ints counting one token each, or Responses API messages); or ``prompt`` (a string
    or a list of them). Text counts one token per 4 characters of each piece, rounded up, or
    exactly with tiktoken's ``cl100k_base`` when tiktoken is installed and its table loads.
    Images and tool calls are not counted: the answer's usage or headers correct the estimate.

    Plus the completion allowance: ``max_tokens``, else ``max_completion_tokens``, else
    ``max_output_tokens``, times ``n`` (default 1) and times the number of prompts of a
    ``prompt`` list. 0 when ``body`` is no such body; never raises on odd shapes, and never
    says more than ``numbers.MAX_COUNT`` (a 400-digit ``max_tokens`` is no count to compute
    with).
    """
    prompt, completion = estimate_sides(body)
    return min(prompt + (completion or 0), MAX_COUNT)


def estimate_sides(body: object) -> tuple[int, int | None]:
    """``estimate_tokens`` by side: the prompt's tokens, and the completion allowance (None
    when the body sets no limit, 0 when it is no LLM request body)."""
    if not isinstance(body, Mapping):
        return 0, 0
    messages, inputs, prompt = body.get("messages"), body.get("input"), body.get("prompt")
    if isinstance(messages, list):
        tokens = _chat_tokens(messages, body.get("system"))
    elif isinstance(inputs, str | list):
        tokens = _inputs_tokens(inputs)
    elif isinstance(prompt, str | list):
        tokens = _inputs_tokens(prompt)
    else:
        return 0, 0
    return min(tokens, MAX_COUNT), completion_allowance(body)


def completion_allowance(body: Mapping[object, object]) -> int | None:
    """The completion tokens a request body allows for (see ``estimate_tokens``); None when it
    sets no limit."""
    prompt = body.get("prompt")
    prompts = _prompt_count(prompt) if isinstance(prompt, str | list) else 1
    allowance = _allowance(body)
    return None if allowance is None else min(allowance * prompts, MAX_COUNT)


def _chat_tokens(messages: list[object], system: object) -> int:
    framed = [message for message in messages if isinstance(message, Mapping)]
    overhead = _MESSAGE_OVERHEAD * len(framed) + _REPLY_PRIMING
    texts = [text for message in framed for text in _message_texts(message)]
    return overhead + _text_tokens([*texts, *_content_texts(system, 0)])


def _inputs_tokens(value: str | list[object]) -> int:
    """An ``input`` or ``prompt``: a string, or a list of strings, token ids, token arrays
    (lists of ids) or Responses API messages."""
    if isinstance(value, str):
        return _text_tokens([value])
    texts: list[str] = []
    tokens = 0
    for element in value:
        if isinstance(element, str):
            texts.append(element)
        elif isinstance(element, int) and not isinstance(element, bool):
            tokens += 1
        elif isinstance(element, list):
            tokens += sum(isinstance(id_, int) and not isinstance(id_, bool) for id_ in element)
        elif isinstance(element, Mapping):
            texts.extend(_message_texts(element))
    return tokens + _text_tokens(texts)


def _prompt_count(prompt: str | list[object]) -> int:
    """How many prompts a ``prompt`` holds, each answered with its own completions: a list of
    ints is one prompt (a token array), a list of strings or token arrays is several."""
    if isinstance(prompt, str):
        return 1
    return max(sum(isinstance(element, str | list) for element in prompt), 1)


def _allowance(body: Mapping[object, object]) -> int | None:
    """The completion tokens the body allows for a prompt: its limit (the largest, when it
    names several: servers differ in which they obey) times ``n`` (or
    ``best_of``, the completions made and billed, when more), each factor taken at most
    ``numbers.MAX_COUNT`` (a 400-digit limit asks for more than any budget holds, and is that
    much, not nothing); None when it sets no limit."""
    made = [body.get("n"), body.get("best_of")]
    choices = max((min(c, MAX_COUNT) for c in made if _whole(c) and c > 0), default=1)
    limits = [min(limit, MAX_COUNT) for limit in map(body.get, _ALLOWANCES) if _whole(limit)]
    return max(limits) * choices if limits else None


def _whole(value: object) -> TypeGuard[int]:
    """A non-negative int of any size, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(value: object) -> TypeGuard[int]:
    """A token count: an int from 0 to ``numbers.MAX_COUNT``, not a bool."""
    return isinstance(value, int) and count_of(value) is not None


def _message_texts(message: Mapping[object, object]) -> Iterator[str]:
    for key in ("role", "name"):
        value = message.get(key)
        if isinstance(value, str):
            yield value
    yield from _content_texts(message.get("content"), 0)


def _content_texts(content: object, depth: int) -> Iterator[str]:
    """The text of a message's content: a string, or parts whose ``"text"`` is the text
    (OpenAI's parts, Anthropic's blocks, a tool result's nested ``"content"``)."""
    if depth > _DEPTH:
        return
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            yield from _content_texts(part, depth + 1)
    elif isinstance(content, Mapping):
        text = content.get("text")
        if isinstance(text, str):
            yield text
        yield from _content_texts(content.get("content"), depth + 1)


def _text_tokens(texts: Iterable[str]) -> int:
    encoding = _encoding()
    return sum(_piece_tokens(text, encoding) for text in texts)


def _piece_tokens(text: str, encoding: _Encoding | None) -> int:
    if encoding is not None:
        # tiktoken's own failure on this text: count its characters instead
        with contextlib.suppress(Exception):
            return len(encoding.encode(text, disallowed_special=()))
    return math.ceil(len(text) / _CHARS_PER_TOKEN)


@functools.cache
def _encoding() -> _Encoding | None:
    """tiktoken's ``cl100k_base`` when tiktoken is installed and its table loads (it may be
    fetched over the network, and fail); else None, and text counts by its characters."""
    try:
        tiktoken = importlib.import_module("tiktoken")
        encoding: _Encoding = tiktoken.get_encoding("cl100k_base")
    except Exception:  # not installed, or no table: the estimate needs neither
        return None
    return encoding


def usage_tokens(data: object) -> int | None:
    """The tokens an answer used by the provider's count: ``usage.total_tokens``, else
    ``input_tokens + output_tokens`` (Anthropic, OpenAI's Responses API), else
    ``prompt_tokens + completion_tokens``, either of a pair standing alone when the other is
    missing. ``data`` is a parsed JSON body or an SDK's return value (read by attribute, or
    through its ``model_dump()``). None when it says no usage; never raises."""
    parts = usage_parts(data)
    if parts is None:
        return None
    inputs, outputs, total = parts
    if total is not None:
        return total
    return (
        None
        if inputs is None and outputs is None
        else min((inputs or 0) + (outputs or 0), MAX_COUNT)
    )


def usage_parts(
    data: object, *, cached: bool = False
) -> tuple[int | None, int | None, int | None] | None:
    """The input, output and total tokens an answer's usage says (see ``usage_tokens``), each
    None when not said, with ``cached`` Anthropic's cache reads and writes (billed, and left
    out of its ``input_tokens``) counted as input, a write twice (the dearest rate Anthropic
    bills one at); None when it says no count."""
    try:
        usage = _field(data, "usage")
        if usage is None and not isinstance(data, Mapping):
            dump = getattr(data, "model_dump", None)
            usage = _field(dump(), "usage") if callable(dump) else None
        if usage is None:
            return None
        inputs = _cached_inputs(usage) if cached else _side(usage, _USAGE_INPUTS)
        parts = inputs, _side(usage, _USAGE_OUTPUTS), _tokens(usage, "total_tokens")
        return None if parts == (None, None, None) else parts
    except Exception:  # an SDK object's property that fails: no usage known
        return None


def _cached_inputs(usage: object) -> int | None:
    """The input tokens with the cache's: its writes twice, its reads once."""
    inputs = _side(usage, _USAGE_INPUTS + _CACHE_INPUTS)
    written = _tokens(usage, _CACHE_INPUTS[0]) or 0
    return None if inputs is None else min(inputs + written, MAX_COUNT)


def _side(usage: object, names: tuple[str, ...]) -> int | None:
    """The sum of the tokens ``usage`` gives under ``names``; None when it gives none."""
    known = [count for count in (_tokens(usage, name) for name in names) if count is not None]
    return min(sum(known), MAX_COUNT) if known else None


def _tokens(usage: object, key: str) -> int | None:
    value = _field(usage, key)
    return value if _count(value) else None


def _field(data: object, key: str) -> object:
    if isinstance(data, Mapping):
        return data.get(key)
    return getattr(data, key, None)
