"""The options as keywords, for ``**options: Unpack[FetchSettings]``: what a
caller may give for each option that ``FetchOptions`` (``fetch_all``, ``Batch``) and
``CallOptions`` (``run_all``, ``CallBatch``) declare in options.py: its type there, or its
``Takes``.

Generated from those declarations by ``python tests/test_api_surface.py`` (and checked by it):
change the declarations, never this file.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, TypedDict

from ..core.backoff import Backoff
from ..core.result import AttemptRecord, Result
from ..http.auth import Auth
from ..http.retries import RetryIf
from ..http.session import Cert, SessionSource, Verify
from ..http.spec import RequestSpec
from ..limits.breaker import Breaker
from ..limits.cooldown import CooldownScope
from ..limits.spend import Prices
from ..limits.tokenrate import TokenRate
from .flags import AnswerRetried
from .options import Expect, Seconds


class FlowSettings(TypedDict, total=False):
    """``FlowOptions`` as keywords."""

    concurrency: int
    attempts: int
    budget: Seconds
    deadline: Seconds | None
    backoff: Backoff
    on_attempt: Callable[[Any, AttemptRecord], None] | None
    on_result: Callable[[Result], None] | None
    rate: float | str | None
    token_rate: TokenRate | float | str | None
    input_token_rate: TokenRate | float | str | None
    output_token_rate: TokenRate | float | str | None
    cost: Callable[[Any], int] | None
    usage: Callable[[Any], int | None] | None
    retry_answers: str | Collection[AnswerRetried]
    hedge_after: Seconds | Literal["p95"] | None
    cooldown: CooldownScope
    breaker: Breaker | None
    adaptive: bool
    processes: int | Literal["auto"]
    metrics: Any
    tracer: Any
    limits: Any
    namespace: str
    lease_ttl: Seconds


class FetchSettings(FlowSettings, total=False):
    """``FetchOptions`` as keywords."""

    session: SessionSource | None
    cookies: bool
    verify: Verify | None
    cert: Cert | None
    deny_private: bool
    paginate: str | None
    cursor_param: str
    max_pages: int | None
    page_items: str | None
    max_cost: Decimal | float | str | None
    prices: Prices | Mapping[str, Any] | str | Path | None
    batch_api: str | None
    poll: Seconds | None
    batch_rows: int | None
    batch_bytes: int | None
    batch_retries: int
    lanes: Literal["batch", "live", "auto"]
    live_latency: Seconds | None
    keep_files: bool
    timeout: Seconds
    per_host: int | None
    fallbacks: tuple[Callable[[RequestSpec, Result | None], Any], ...]
    dedup: bool
    quota_headers: bool
    expect: Expect
    headers: Mapping[str, str] | None
    secret_headers: tuple[str, ...]
    secret_params: tuple[str, ...]
    max_bytes: int
    retry_statuses: str | Collection[int]
    retry_if: RetryIf | None
    auth: Auth | None


class CallSettings(FlowSettings, total=False):
    """``CallOptions`` as keywords."""

    per_key: Callable[[Any], str] | None
    fallbacks: tuple[Callable[[Any, Result | None], Any], ...]
    retry_if: Callable[[BaseException], bool] | None
