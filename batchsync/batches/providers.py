"""The providers' batch endpoints batchsync submits to, one module each (``BatchProvider``),
registered here by name; and the endpoint a run's URL is the batch endpoint of.

A new provider is a module implementing ``protocol.BatchProvider`` and one ``register`` line
below: its shape (statuses, ids, uploads) joins what the journal checks.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..store.submissions import SHAPES
from .anthropic import Anthropic
from .gemini import Gemini
from .openai import OpenAI
from .protocol import BatchProvider, Endpoint

# ``--batch-api`` alone: the provider the URL's path names.
AUTO = "auto"

PROVIDERS: dict[str, BatchProvider] = {}


def register(provider: BatchProvider) -> None:
    """``provider`` known by its name, its parts' shape checked in every journal."""
    PROVIDERS[provider.name] = provider
    SHAPES[provider.name] = provider.shape


register(OpenAI())
register(Anthropic())
register(Gemini())


def provider_of(endpoint: Endpoint) -> BatchProvider:
    return PROVIDERS[endpoint.provider]


def endpoint_of(url: str, asked: str) -> Endpoint:
    """The batch endpoint for the live URL ``url``: the provider ``asked`` (``auto``: the
    one its path names). ValueError saying what is wrong."""
    parts = urlsplit(url)
    if "{" in url:
        raise ValueError("--batch-api: the URL must be one endpoint, without {fields}")
    if parts.query or parts.fragment:
        raise ValueError("--batch-api: the URL must be the endpoint itself, without a query")
    if asked == AUTO:
        for provider in PROVIDERS.values():
            found = provider.endpoint(parts)
            if found is not None:
                return found
        raise ValueError(
            "--batch-api cannot tell the provider from the URL: it is the batch endpoint of "
            "none of " + ", ".join(PROVIDERS) + "; give --batch-api=NAME for a compatible server"
        )
    named = PROVIDERS.get(asked)
    if named is None:
        raise ValueError(f"--batch-api: {asked!r} is not one of {', '.join(PROVIDERS)}")
    found = named.endpoint(parts)
    if found is None:
        raise ValueError(f"--batch-api={asked}: the URL must {named.describe_endpoints()}")
    return found
