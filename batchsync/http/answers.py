"""What an LLM answer says of itself: cut short by its token limit, or held back by the
provider's filter (``retry_answers``). Read from the body as the providers write it, for a
chat completion or completion (``choices[].finish_reason``, a message's ``refusal``),
a Responses API answer (``incomplete_details.reason``) and Anthropic's messages
(``stop_reason``); any other body says nothing."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Literal

from ..core.verdict import Verdict

Flaw = Literal["truncated", "filtered"]
# What each provider's word for how an answer ended means.
_ENDINGS: dict[object, Flaw] = {
    "length": "truncated",  # (OpenAI's finish_reason)
    "max_tokens": "truncated",  # (Anthropic's stop_reason)
    "max_output_tokens": "truncated",  # (the Responses API's incomplete reason)
    "content_filter": "filtered",
    "refusal": "filtered",  # (Anthropic's stop_reason)
}


def answer_flaw(data: object) -> tuple[Flaw, str] | None:
    """How the answer ``data`` (a parsed JSON body) fell short, and the provider's word for
    it (``finish_reason length``); None when it did not, or says nothing of it. A choice cut
    short or filtered flaws the whole answer."""
    if not isinstance(data, Mapping):
        return None
    for name, word in _endings(data):
        flaw = _ENDINGS.get(word) if isinstance(word, str) else None
        if flaw is not None:
            return flaw, f"{name} {word}"
    return None


def _endings(data: Mapping[str, object]) -> Iterator[tuple[str, object]]:
    """Each word of the answer on how it ended, with the name it is written under."""
    yield "stop_reason", data.get("stop_reason")
    details = data.get("incomplete_details")
    if isinstance(details, Mapping):
        yield "incomplete_details.reason", details.get("reason")
    choices = data.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, Mapping):
            yield "finish_reason", choice.get("finish_reason")
            message = choice.get("message")
            if isinstance(message, Mapping) and message.get("refusal"):
                yield "message", "refusal"


def taken(answer: Verdict, retried: Collection[str]) -> Verdict:
    """``answer``, or a retry of it (by any method: the caller asked for another answer)
    when its data (a JSON body, or an SDK's object) is cut short or filtered and ``retried``
    names that flaw; its facts kept, as it was paid for."""
    if not retried:
        return answer
    data = answer.data
    dump = getattr(data, "model_dump", None)
    if not isinstance(data, Mapping) and callable(dump):
        try:
            data = dump()
        except Exception:  # an SDK object that cannot say: taken as it is
            return answer
    flaw = answer_flaw(data)
    if flaw is None or flaw[0] not in retried:
        return answer
    kind, word = flaw
    return Verdict("retry", kind, f"answer {kind} ({word})", answer.facts, resendable=True)
