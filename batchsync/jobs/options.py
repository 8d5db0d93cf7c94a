"""Validated options: every bad value is refused here, before any request is sent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

import requests
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..core.backoff import Backoff
from ..core.redact import Secrets
from ..core.result import AttemptRecord, Result
from ..http.paginate import Paging, paging
from ..http.retries import RETRY_STATUSES, RetryIf, parse_statuses
from ..http.spec import RequestSpec, check_headers, one_line
from ..limits.announced import AnnouncedRates
from ..limits.breaker import Breaker
from ..limits.cooldown import CooldownScope
from ..limits.rates import Window, parse_rate
from ..limits.tokenrate import TokenRate

Expect = Literal["json", "text", "bytes"] | type[BaseModel]
# The rate that the provider's headers announce.
AUTO = "auto"

# Where requests finds a CA bundle when the request's verify is not given (trust_env).


# The most items in progress at once: a thread each. Past some thousands a process spends
# more on switching threads than it gains in flight; more is several processes (--redis).
MAX_CONCURRENCY = 10_000
# The most seconds a timeout, budget, deadline or lease may be, about 31 years: well within
# what a thread or a socket can wait (``threading.TIMEOUT_MAX``, some 9.2e9 s), even added to
# the clock. Beyond it, an attempt's timer overflows: a Result of OverflowError, not a timeout.
MAX_SETTING_SECONDS = 1_000_000_000
Seconds = Annotated[float, Field(gt=0, le=MAX_SETTING_SECONDS)]


class EngineOptions(BaseModel):
    """What every batch takes: how many at once, how many tries, how much time."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, allow_inf_nan=False
    )

    concurrency: int = Field(default=10, ge=1, le=MAX_CONCURRENCY)
    attempts: int = Field(default=3, ge=1)
    budget: Seconds = 60.0
    deadline: Seconds | None = None
    backoff: Backoff = Backoff()
    # Hooks, called from worker threads; an exception in one is logged and ignored.
    on_attempt: Callable[[Any, AttemptRecord], None] | None = None
    on_result: Callable[[Result], None] | None = None


class FlowOptions(EngineOptions):
    """What every batch, HTTP or not, adds: the limits its attempts pass and who watches."""

    # Attempts a second over all workers, or a period's: "500/min", "10/s", "3600/h"; "auto":
    # the requests and tokens a minute the provider's headers announce (OpenAI, Anthropic).
    rate: float | str | None = None
    # A budget of LLM tokens ("200000/min"), each item weighed by ``cost(item)`` (default: its
    # request body's estimate, ``tokens.estimate_tokens``) and set right by ``usage(data)``
    # (default: the answer's ``usage``) or the provider's remaining-tokens header.
    token_rate: TokenRate | None = None
    cost: Callable[[Any], int] | None = None
    usage: Callable[[Any], int | None] | None = None
    # Seconds (or "p95") after which a slow attempt gets a second, racing one (HTTP: GETs
    # only; calls: only what may safely run twice).
    hedge_after: Seconds | Literal["p95"] | None = None
    cooldown: CooldownScope = "host"
    breaker: Breaker | None = Breaker()
    adaptive: bool = False
    # A prometheus_client CollectorRegistry to keep the run's metrics in.
    metrics: Any = None
    # An OpenTelemetry tracer; None: the global provider's, when one is configured.
    tracer: Any = None
    # Limits shared by several processes: a redis:// URL (or a SharedLimits backend), the
    # namespace naming the shared quota, and how long a slot lease lives without renewal.
    limits: Any = None
    namespace: str = "batchsync"
    lease_ttl: Seconds = 10.0

    @property
    def slots(self) -> int | None:
        """Attempts in flight per limit key (a host, or what ``per_key`` says)."""
        return None

    @property
    def rate_window(self) -> Window | None:
        """``rate`` as the window that holds it (None: none, or the provider's, ``"auto"``)."""
        return None if self.rate in (None, AUTO) else Window.of(parse_rate(self.rate))

    @property
    def announced_rates(self) -> AnnouncedRates | None:
        """With ``rate="auto"``: the budgets the provider's headers announce."""
        return AnnouncedRates(tokens=self.token_rate is None) if self.rate == AUTO else None

    @field_validator("rate")
    @classmethod
    def _rate_readable(cls, value: float | str | None) -> float | str | None:
        if value is not None and value != AUTO:
            parse_rate(value)
        return value

    @field_validator("token_rate", mode="before")
    @classmethod
    def _token_rate_of(cls, value: object) -> object:
        return value if value is None or isinstance(value, TokenRate) else TokenRate.of(value)  # type: ignore[arg-type]

    def secrets(self) -> Secrets:
        """The run's secrets known up front: the Redis URL's password."""
        return Secrets.of(None, (), (), _redis_password(self.limits))


class CallOptions(FlowOptions):
    """What a batch of calls adds: a limit key per item, fallbacks called with the item."""

    # Calls are often heavier than requests.
    concurrency: int = Field(default=4, ge=1, le=MAX_CONCURRENCY)
    # Off: calls share no host, and one breaker over every item would let some items'
    # failures hold the healthy ones; give per_key and a Breaker to have one per key.
    breaker: Breaker | None = None
    # The key an item's limits are kept under (its cooldown, breaker); None: one for all.
    per_key: Callable[[Any], str] | None = None
    fallbacks: tuple[Callable[[Any, Result | None], Any], ...] = ()
    retry_if: Callable[[BaseException], bool] | None = None


class FetchOptions(FlowOptions):
    """What an HTTP batch adds: per-attempt timeout, body handling, headers, session, limits."""

    timeout: Seconds = 10.0
    per_host: int | None = Field(default=None, ge=1)
    fallbacks: tuple[Callable[[RequestSpec, Result | None], Any], ...] = ()
    dedup: bool = False
    deny_private: bool = False
    # Hold a host whose rate-limit headers say its quota is spent, until the reset.
    quota_headers: bool = True
    # Follow each item's pages (see ``paginate.paging``): link, json:PATH, page:PARAM or
    # offset:PARAM,STEP; a cursor found at json:PATH is sent as ``cursor_param``. The item's
    # data is the list of its pages' bodies or, with ``page_items`` (a JMESPath), one flat
    # list of the records found there in each page.
    paginate: str | None = None
    cursor_param: str = Field(default="cursor", min_length=1)
    max_pages: int | None = Field(default=None, ge=1)
    page_items: str | None = None
    expect: Expect = "json"
    headers: dict[str, str] | None = None
    secret_headers: tuple[str, ...] = ()
    # Query parameters whose values are secret, besides redact.SECRET_PARAMS (api_key, token…).
    secret_params: tuple[str, ...] = ()
    max_bytes: int = Field(default=32 * 2**20, ge=1)
    # What is retried (besides what each error kind says): the statuses, as text ("429,
    # 502-504", "5xx") or numbers, and ``retry_if(status_code, error_kind)`` -> True (retry),
    # False (final) or None (as the statuses and the kind say).
    retry_statuses: str | frozenset[int] = RETRY_STATUSES
    retry_if: RetryIf | None = None
    session: Any = None
    # Keep the cookies responses set during the run (each sent back to its origin only).
    cookies: bool = True
    # TLS as in requests: a CA bundle path (or directory), True, or False; a client certificate
    # file or (certificate, key). None: requests' own choice (REQUESTS_CA_BUNDLE, certifi).
    verify: bool | str | None = None
    cert: str | tuple[str, str] | None = None
    # Tokens that expire (see auth.py): a callable returning the token's headers, called again
    # for each refresh after a 401, or a requests AuthBase applied to each request.
    auth: Any = None

    @property
    def slots(self) -> int | None:
        return self.per_host

    def secrets(self) -> Secrets:
        """The run's secrets: its headers and declared names, and the Redis URL's password."""
        return Secrets.of(
            self.headers, self.secret_headers, self.secret_params, _redis_password(self.limits)
        )

    def paging_identity(self) -> dict[str, str]:
        """What a journal records of the pagination (none when there is none): a resumed run
        must read the pages it goes on with as the pages before were read."""
        if self.paginate is None:
            return {}
        return {"paging": f"{self.paginate} cursor={self.cursor_param} items={self.page_items}"}

    def paging(self) -> Paging | None:
        """How items are paginated; None when they are not."""
        if self.paginate is None:
            return None
        return paging(
            self.paginate,
            cursor_param=self.cursor_param,
            records=self.page_items,
            max_pages=self.max_pages,
        )

    @model_validator(mode="after")
    def _paging_known(self) -> FetchOptions:
        if self.paginate is None:
            if self.page_items is not None or self.max_pages is not None:
                raise ValueError("page_items (--items) and max_pages (--max-pages) need paginate")
            return self
        found = self.paging()
        assert found is not None
        if self.expect != "json" and (found.style == "json" or found.records is not None):
            raise ValueError("paginate json:PATH and page_items (--items) read JSON: expect='json'")
        return self

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value:
            check_headers(value)
        return value

    @field_validator("retry_statuses")
    @classmethod
    def _statuses_known(cls, value: str | frozenset[int]) -> str | frozenset[int]:
        parse_statuses(value)
        return value

    @field_validator("verify")
    @classmethod
    def _ca_exists(cls, value: bool | str | None) -> bool | str | None:
        if isinstance(value, str) and not Path(value).exists():
            raise ValueError(f"no CA bundle or directory at {value}")
        return value

    @field_validator("cert")
    @classmethod
    def _cert_files_exist(cls, value: str | tuple[str, str] | None) -> object:
        for path in (value,) if isinstance(value, str) else value or ():
            if not Path(path).is_file():
                raise ValueError(f"no certificate or key file at {path}")
        return value

    @field_validator("auth")
    @classmethod
    def _auth_source(cls, value: object) -> object:
        if value is None or callable(value):  # (an AuthBase is callable too)
            return value
        raise ValueError(
            "must be a callable returning headers (called again to refresh the token) or a "
            "requests.auth.AuthBase"
        )

    @field_validator("session")
    @classmethod
    def _session_or_factory(cls, value: object) -> object:
        if value is None or isinstance(value, requests.Session) or callable(value):
            return value
        raise ValueError("must be a requests.Session or a zero-argument factory of one")


def _redis_password(limits: object) -> list[str]:
    url = getattr(limits, "url", limits)
    try:
        password = urlsplit(url).password if isinstance(url, str) else None
    except ValueError:
        return []
    return [password] if password else []


# The options' defaults, for the library's and the CLI's signatures (the models hold them).
DEFAULT = FetchOptions()
CALL_DEFAULT = CallOptions()

OptionsT = TypeVar("OptionsT", bound=EngineOptions)


def build(model: type[OptionsT], **values: Any) -> OptionsT:
    """Validate options, turning pydantic's report into one ValueError line."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise ValueError(f"invalid option: {one_line(exc)}") from None
