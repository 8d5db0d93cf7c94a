"""Validated options, each declared once: every bad value is refused here, before any
request is sent."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Collection, Mapping
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

import requests
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..core.backoff import Backoff
from ..core.redact import Secrets
from ..core.result import AttemptRecord, Result
from ..core.verdict import TokenSide
from ..http.auth import Auth
from ..http.hedge import HedgeDelay, Hedger
from ..http.paginate import Paging, paging
from ..http.retries import RETRY_STATUSES, RetryIf, parse_statuses
from ..http.session import Cert, SessionSource, Verify
from ..http.spec import RequestSpec, one_line, sendable_headers
from ..limits.announced import AnnouncedRates
from ..limits.breaker import Breaker
from ..limits.cooldown import CooldownScope
from ..limits.gates import Gates
from ..limits.rates import Window, parse_rate
from ..limits.spend import MaxCost, Prices, dollars
from ..limits.tokenrate import OPTION_OF, TokenRate
from ..limits.tokens import usage_tokens
from .flags import (
    BREAKER_DEFAULT,
    HONOURED,
    MAX_SETTING_SECONDS,
    AnswerRetried,
    Flag,
    Honoured,
    Takes,
    answers_text,
    breaker_text,
    cost_text,
    header_lines,
    header_names,
    hedge_text,
    prices_text,
    processes_text,
    rate_text,
    statuses_text,
    token_rate_text,
)

F = TypeVar("F", bound=Callable[..., Any])
Expect = Literal["json", "text", "bytes"] | type[BaseModel]
# The rate that the provider's headers announce.
AUTO = "auto"

# The most items in progress at once: a thread each. Past some thousands a process spends
# more on switching threads than it gains in flight; more is several processes (--redis).
MAX_CONCURRENCY = 10_000
Seconds = Annotated[float, Field(gt=0, le=MAX_SETTING_SECONDS)]
# Every options model's: frozen, no unknown option, no nan or infinity.
_CONFIG = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, allow_inf_nan=False)


# Each token budget's option by the side it holds.
_SIDES = {option: side for side, option in OPTION_OF.items()}


def budget_flag(side: TokenSide, help: str) -> Flag:
    """The flag of the token budget of ``side`` (--token-rate, --input-token-rate, …)."""
    option = OPTION_OF[side]
    return Flag(
        f"--{option.replace('_', '-')}",
        metavar="N[/s|/min|/h]",
        parse=partial(token_rate_text, name=option),
        help=help,
    )


class EngineOptions(BaseModel):
    """What every batch takes: how many at once, how many tries, how much time.

    Each option is declared once, here and in the subclasses: its type, default and bounds
    (the library's validation), and in its annotation a ``Flag`` when the CLI offers it (the
    click option is made from the field) and ``Takes`` when a caller may give more than the
    field keeps. The library's keyword signatures (``FetchSettings``, ``CallSettings`` in
    settings.py) are generated from these declarations."""

    model_config = _CONFIG

    concurrency: Annotated[
        int,
        Flag(
            "--concurrency",
            short="-c",
            help=f"At most N items in progress at once (1 to {MAX_CONCURRENCY}).",
        ),
    ] = Field(default=10, ge=1, le=MAX_CONCURRENCY)
    attempts: Annotated[
        int, Flag("--attempts", help="Total tries per item, the first included."), HONOURED
    ] = Field(default=3, ge=1)
    budget: Annotated[
        Seconds,
        Flag(
            "--budget",
            metavar="SECONDS",
            help="Seconds per item from when a worker takes it, retry waits included.",
        ),
        HONOURED,
    ] = 60.0
    deadline: Annotated[
        Seconds | None,
        Flag(
            "--deadline",
            metavar="SECONDS",
            help="Seconds for the whole batch; items not started by then are not sent.  "
            "[default: none]",
        ),
        HONOURED,
    ] = None
    backoff: Annotated[Backoff, HONOURED] = Backoff()
    # Hooks, called from worker threads; an exception in one is logged and ignored.
    on_attempt: Callable[[Any, AttemptRecord], None] | None = None
    on_result: Annotated[Callable[[Result], None] | None, HONOURED] = None


class FlowOptions(EngineOptions):
    """What every batch, HTTP or not, adds: the limits its attempts pass and who watches."""

    # Attempts a second over all workers, or a period's: "500/min", "10/s", "3600/h"; "auto":
    # the requests and tokens a minute the provider's headers announce (OpenAI, Anthropic).
    rate: Annotated[
        float | str | None,
        Flag(
            "--rate",
            metavar="N[/s|/min|/h]",
            parse=rate_text,
            help="At most this many attempts in any second (or minute, hour: 500/min) over all "
            "workers, retries included, as the server counts them: give the limit itself. "
            "Sends are evenly paced (no burst at the start); an attempt counts until a period "
            "after it ended. auto: the requests (and, without --token-rate, the tokens) a "
            "minute that the API's rate-limit headers announce (OpenAI's x-ratelimit-limit-*, "
            "Anthropic's anthropic-ratelimit-*-limit), following each answer.  [default: none; "
            "a bare N is per second]",
        ),
    ] = None
    # A budget of LLM tokens ("200000/min"), each item weighed by ``cost(item)`` (default: its
    # request body's estimate, ``tokens.estimate_tokens``) and set right by ``usage(data)``
    # (default: the answer's ``usage``) or the provider's remaining-tokens header.
    token_rate: Annotated[
        TokenRate | None,
        Takes(TokenRate | float | str | None),
        budget_flag(
            "tokens",
            "At most this many LLM tokens in any second, minute or hour over all workers "
            "(200000/min), held as --rate holds its count: give the limit itself. Each item "
            "takes its request body's estimated tokens (the text of messages, input or prompt "
            "at about 4 characters a token, plus max_tokens x n) before it is sent, or its "
            "usage when the answer says more. An item that needs more than the whole budget "
            "fails at once, unsent.  [default: none]",
        ),
    ] = None
    # The same of one side of each request (providers that count them apart: Anthropic).
    input_token_rate: Annotated[
        TokenRate | None,
        Takes(TokenRate | float | str | None),
        budget_flag(
            "input",
            "At most this many input (prompt) tokens in any second, minute or hour, held as "
            "--token-rate holds all of them; each item takes its prompt's estimate, or its "
            "usage's input tokens when the answer says more.  [default: none]",
        ),
    ] = None
    output_token_rate: Annotated[
        TokenRate | None,
        Takes(TokenRate | float | str | None),
        budget_flag(
            "output",
            "At most this many output (completion) tokens in any second, minute or hour; each "
            "item takes its completion limit (max_tokens x n) before it is sent, then what its "
            "answer made, as Anthropic counts it. An LLM request without a completion limit "
            "fails at once, unsent.  [default: none]",
        ),
    ] = None
    cost: Callable[[Any], int] | None = None
    usage: Callable[[Any], int | None] | None = None
    # LLM answers tried again rather than taken (``http.answers``): "truncated", "filtered",
    # "invalid" (failing ``expect``), as text ("truncated,filtered") or names.
    retry_answers: Annotated[
        frozenset[AnswerRetried],
        Takes(str | Collection[AnswerRetried]),
        Flag(
            "--retry-answers",
            metavar="truncated,filtered,invalid",
            typed_default="",
            show_default=False,
            parse=answers_text,
            help="Try again, within --attempts (and --max-cost), an LLM answer cut short by its "
            "token limit (finish_reason length, stop_reason max_tokens: truncated), held back by "
            "the provider's filter (content_filter, a refusal: filtered) or failing --expect "
            "(invalid), whatever the method; each is paid for, and its usage counted. One "
            "still so after the last attempt fails with that kind.  [default: none]",
        ),
    ] = frozenset()
    # Seconds (or "p95") after which a slow attempt gets a second, racing one (HTTP: GETs
    # only; calls: only what may safely run twice).
    hedge_after: Annotated[
        Seconds | Literal["p95"] | None,
        Flag(
            "--hedge-after",
            metavar="SECONDS|p95",
            parse=hedge_text,
            help="GETs unanswered after this long get a second identical request; the first "
            "answer wins.  [default: off]",
        ),
    ] = None
    cooldown: Annotated[
        CooldownScope,
        Flag(
            "--cooldown",
            help="After a 429 or 503 with Retry-After, hold every worker's attempts to that "
            "host (or to all hosts) until it has passed.",
        ),
    ] = "host"
    breaker: Annotated[
        Breaker | None,
        Flag(
            "--breaker",
            metavar="RATIO[:WINDOW[:MIN_CALLS[:SECONDS]]]|on|off",
            typed_default="on",
            parse=breaker_text,
            help="Open a host's circuit when at least RATIO of its last WINDOW attempts failed "
            "(connection errors, timeouts, 5xx, 429 without Retry-After), once MIN_CALLS were "
            "seen; an open circuit holds the host's items for SECONDS, then lets one probe "
            "through: its success closes the circuit, its failure starts another break. An "
            "item ends as circuit_open only when its budget or the deadline cannot cover the "
            f"wait. on = {BREAKER_DEFAULT}.",
        ),
    ] = Breaker()
    adaptive: Annotated[
        bool,
        Flag(
            "--adaptive",
            help="Find the API's capacity: raise the attempts in flight (up to the "
            "concurrency) until 429, 503 or timeouts, then halve them.",
        ),
    ] = False
    # Worker processes, each its own thread pool over a share of the items and of every limit
    # (run/processes.py); "auto": one per core. 1: the items are sent from this process.
    processes: Annotated[
        int | Literal["auto"],
        Flag(
            "--processes",
            metavar="N|auto",
            parse=processes_text,
            help="Send from N worker processes (auto: one per core), each a thread pool with "
            "a fixed share of --concurrency, --rate, --token-rate and --per-host that sums to "
            "the whole (with --redis the shared backend holds them instead); this process "
            "journals every result and writes the outputs, as one process does. For a fast "
            "client on a slow API, where one process is bound by its core.",
        ),
    ] = 1
    # A prometheus_client CollectorRegistry to keep the run's metrics in.
    metrics: Any = None
    # An OpenTelemetry tracer; None: the global provider's, when one is configured.
    tracer: Any = None
    # Limits shared by several processes: a redis:// URL (or a SharedLimits backend), the
    # namespace naming the shared quota, and how long a slot lease lives without renewal.
    limits: Any = None
    namespace: Annotated[
        str,
        Flag(
            "--namespace",
            help="The shared quota's name in Redis: processes with the same one share their "
            "limits.",
        ),
    ] = "batchsync"
    lease_ttl: Annotated[
        Seconds,
        Flag(
            "--lease-ttl",
            metavar="SECONDS",
            help="With --redis: how long the per-host slots of a process that died stay taken.",
        ),
    ] = 10.0

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
        if self.rate != AUTO:
            return None
        return AnnouncedRates(own=frozenset(budget.side for budget in self.token_rates))

    @property
    def token_rates(self) -> tuple[TokenRate, ...]:
        """The token budgets given: of all tokens, of the input's, of the output's."""
        given = (self.token_rate, self.input_token_rate, self.output_token_rate)
        return tuple(budget for budget in given if budget is not None)

    @property
    def usage_reader(self) -> Callable[[Any], int | None] | None:
        """What an answer used, for a token budget to set its estimate right (None: none)."""
        return self.usage or usage_tokens if self.token_rates else None

    @property
    def sides_read(self) -> bool:
        """Whether an answer's usage is read by side: for a budget of one side."""
        return any(budget.side != "tokens" for budget in self.token_rates)

    def hedger(self, gates: Gates | None) -> Hedger | None:
        """The run's hedging threads, when ``hedge_after`` asks for them."""
        if self.hedge_after is None:
            return None
        return Hedger(HedgeDelay(self.hedge_after), workers=2 * self.concurrency, gates=gates)

    _rate_readable = field_validator("rate")(staticmethod(rate_text))  # (as --rate reads it)
    _processes_readable = field_validator("processes", mode="before")(staticmethod(processes_text))

    @model_validator(mode="after")
    def _budgets_weigh_every_copy(self) -> FlowOptions:
        if self.token_rates and self.hedge_after is not None:
            named = OPTION_OF[self.token_rates[0].side]
            raise ValueError(
                f"{named} (--{named.replace('_', '-')}) cannot weigh the second copy "
                "hedge_after (--hedge-after) sends: give one of them"
            )
        return self

    @field_validator("retry_answers", mode="before")
    @classmethod
    def _answers_named(cls, value: object) -> object:
        return answers_text(value)

    @field_validator("token_rate", "input_token_rate", "output_token_rate", mode="before")
    @classmethod
    def _token_rate_of(cls, value: object, info: ValidationInfo) -> object:
        side = _SIDES[info.field_name or "token_rate"]
        return value if value is None else TokenRate.of(value, side)  # type: ignore[arg-type]

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


class _Family(BaseModel):
    """A family of options, declared and taken together: a consumer typed to take the family
    sees only its fields, whether given the family or the whole options made of families."""

    model_config = _CONFIG


class Connection(_Family):
    """How the run's one way out connects: the session, cookies, TLS and the guard (the
    transport's family)."""

    session: Annotated[Any, Takes(SessionSource | None)] = None
    cookies: Annotated[
        bool,
        Flag(
            "--cookies/--no-cookies",
            help="Keep the cookies responses set, each sent back only to the origin (scheme, "
            "host, port) that set it.",
        ),
    ] = True
    # TLS as in requests: a CA bundle path (or directory), True, or False; a client certificate
    # file or (certificate, key). None: requests' own choice (REQUESTS_CA_BUNDLE, certifi).
    verify: Verify | None = None
    cert: Cert | None = None
    deny_private: Annotated[
        bool,
        Flag(
            "--deny-private",
            help="Refuse hosts that resolve to loopback, private, link-local or multicast "
            "addresses (checked after DNS, on every redirect and on each connection), for URL "
            "lists from elsewhere.",
        ),
    ] = False

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

    @field_validator("session")
    @classmethod
    def _session_or_factory(cls, value: object) -> object:
        if value is None or isinstance(value, requests.Session) or callable(value):
            return value
        raise ValueError("must be a requests.Session or a zero-argument factory of one")


class Pages(_Family):
    """How each item's pages are followed (the pager's family)."""

    # Follow each item's pages (see ``paginate.paging``): link, json:PATH, page:PARAM or
    # offset:PARAM,STEP; a cursor found at json:PATH is sent as ``cursor_param``. The item's
    # data is the list of its pages' bodies or, with ``page_items`` (a JMESPath), one flat
    # list of the records found there in each page.
    paginate: Annotated[
        str | None,
        Flag(
            "--paginate",
            metavar="HOW",
            help="Follow each item's pages, each a retried attempt within the item's budget: "
            'link (the Link header\'s rel="next"), json:PATH (the next URL, or a cursor sent as '
            "--cursor-param, at a JMESPath in the body), page:PARAM (1, 2, … until an empty "
            "page) or offset:PARAM,STEP (0, STEP, … until an empty page). The item's data is "
            "the list of its pages' bodies (see --items); a page that fails keeps the pages "
            "before it, and --resume goes on from it.",
        ),
    ] = None
    cursor_param: Annotated[
        str,
        Flag(
            "--cursor-param",
            metavar="NAME",
            show_default=True,
            help="The query parameter a cursor found by --paginate json:PATH is sent in.",
        ),
    ] = Field(default="cursor", min_length=1)
    max_pages: Annotated[
        int | None,
        Flag(
            "--max-pages", metavar="N", help="Fetch at most N pages of each item (with --paginate)."
        ),
    ] = Field(default=None, ge=1)
    page_items: Annotated[
        str | None,
        Flag(
            "--items",
            metavar="PATH",
            help="With --paginate: the item's data is one flat list of the records at this "
            "JMESPath in each page (e.g. data.items), instead of the list of whole pages.",
        ),
    ] = None

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


class BatchApi(_Family):
    """How rows go through a provider's batch endpoint (the batch lane's family)."""

    # Send the rows through the provider's batch endpoint instead of one call each (see
    # batchsync/batches): the provider named (one of those batches/providers.py registers:
    # "openai", "anthropic"), or "auto" (the one the URL's path names).
    batch_api: Annotated[
        str | None,
        Flag(
            "--batch-api",
            metavar="[=openai|anthropic|gemini]",
            help="With --url (OpenAI's /v1/chat/completions, /v1/embeddings, /v1/completions, "
            "/v1/responses, /v1/moderations, /v1/images/generations, /v1/images/edits or "
            "/v1/videos; Anthropic's /v1/messages; Gemini's /v1beta/models/MODEL:generateContent) "
            "and --row-as-body or --body-template: "
            "send the rows through the provider's batch endpoint (OpenAI's Batch API, "
            "Anthropic's Message Batches, Gemini's batch mode: half the price, results within "
            "24 hours) instead of "
            "one call each. The rows are split at the provider's caps, each part journaled as "
            "it is uploaded, submitted and polled; Ctrl-C leaves the batches running, and "
            "--resume polls them again, never submitting a part twice. Given alone, the "
            "provider is the one the URL's path names; =openai, =anthropic or =gemini for a "
            "compatible server. The results are written in input order, one per row, as a "
            "live run's.",
        ),
    ] = None
    poll: Annotated[
        Seconds | None,
        Flag(
            "--poll",
            metavar="SECONDS",
            help="With --batch-api: poll each batch every SECONDS.  [default: from 5 s, "
            "growing by half each time to 60 s]",
        ),
    ] = None
    batch_rows: Annotated[
        int | None,
        Flag(
            "--batch-rows",
            metavar="N",
            help="With --batch-api: at most N rows a submission.  [default: the provider's cap, "
            "OpenAI 50000, Anthropic 100000]",
        ),
    ] = Field(default=None, ge=1)
    batch_bytes: Annotated[
        int | None,
        Flag(
            "--batch-bytes",
            metavar="BYTES",
            help="With --batch-api: at most BYTES a submission (OpenAI's file, Anthropic's "
            "request).  [default: the provider's cap, OpenAI 200 MB, Anthropic 256 MB]",
        ),
    ] = Field(default=None, ge=1)
    batch_retries: Annotated[
        int,
        Flag(
            "--batch-retries",
            metavar="N",
            help="With --batch-api: a row its batch did not run in time (batch_expired) or "
            "answered with a status the retry policy retries (--retry-statuses, 429 and 5xx "
            "by default) is sent again in a new part of the same run, at most N times, while "
            "the deadline leaves time; its result counts every try. 0: never (--retry-failed "
            "sends them later).  [default: 2]",
        ),
    ] = Field(default=2, ge=0, le=100)
    lanes: Annotated[
        Literal["batch", "live", "auto"],
        Flag(
            "--lanes",
            metavar="batch|live|auto",
            help="With --batch-api: which lane answers the rows. batch: every row through the "
            "batch endpoint. live: every row one call each, at the full price. auto (with "
            "--deadline): through the batch endpoint, until what is left of the deadline "
            "would no longer hold a live pass of the rows still open (by --concurrency, "
            "--rate, --token-rate and --live-latency); then their batches are cancelled, the "
            "rows they answered collected, and only the others sent live, under every live "
            "limit. No row is answered by both.  [default: batch]",
        ),
    ] = "batch"
    live_latency: Annotated[
        Seconds | None,
        Flag(
            "--live-latency",
            metavar="SECONDS",
            help="With --lanes auto: the seconds one live call takes, to plan the live pass.  "
            "[default: --timeout]",
        ),
    ] = None
    keep_files: Annotated[
        bool,
        Flag(
            "--keep-files",
            help="With --batch-api: keep the uploaded and result files (OpenAI) or the batches "
            "(Anthropic) at the provider; by default they are deleted once every result is "
            "journaled.",
        ),
    ] = False


class Spend(_Family):
    """A cap on what the run spends, priced by the user's own table (see limits/spend.py)."""

    max_cost: Annotated[
        Decimal | None,
        Takes(Decimal | float | str | None),
        Flag(
            "--max-cost",
            metavar="USD",
            parse=cost_text,
            help="With --prices: spend at most USD dollars. Before each request is sent (with "
            "--batch-api: each part), its worst case is reserved (every byte of its body as an "
            "input token, its max_tokens x n as output), and the answer's usage replaces it; "
            "no request is sent that could take the spend over the cap, whatever is in flight. "
            "Items that cannot be afforded end unsent as cost, to run again with a larger "
            "cap.  [default: none]",
        ),
    ] = None
    prices: Annotated[
        Prices | None,
        Takes(Prices | Mapping[str, Any] | str | Path | None),
        Flag(
            "--prices",
            metavar="FILE",
            parse=prices_text,
            help="With --max-cost: a JSON file of each model's dollars per million tokens, "
            '{"models": {"gpt-4o-mini": {"input": 0.15, "output": 0.6}}, "batch": 0.5} '
            "(batch: the batch endpoint's share of the price, for --batch-api). A model it "
            "does not price is never sent.",
        ),
    ] = None

    @property
    def spend_cap(self) -> MaxCost | None:
        """The cap, as the gate that holds it (None: none)."""
        if self.max_cost is None or self.prices is None:
            return None
        return MaxCost(dollars(self.max_cost), self.prices)

    @field_validator("max_cost", mode="before")
    @classmethod
    def _dollars(cls, value: object) -> object:
        if value is None or isinstance(value, bool):
            return value
        dollars(value)
        return Decimal(str(value))

    _priced = field_validator("prices", mode="before")(staticmethod(prices_text))

    @model_validator(mode="after")
    def _together(self) -> Spend:
        if (self.max_cost is None) != (self.prices is None):
            raise ValueError("max_cost (--max-cost) and prices (--prices) go together")
        return self


class FetchOptions(BatchApi, Spend, Pages, Connection, FlowOptions):
    """What an HTTP batch adds: per-attempt timeout, body handling, headers, session, limits."""

    timeout: Annotated[
        Seconds,
        Flag(
            "--timeout", metavar="SECONDS", help="Wall-clock bound of one attempt, body included."
        ),
        HONOURED,
    ] = 10.0
    per_host: Annotated[
        int | None,
        Flag(
            "--per-host",
            metavar="N",
            help="At most N attempts in flight to one host.  [default: none]",
        ),
    ] = Field(default=None, ge=1)
    fallbacks: tuple[Callable[[RequestSpec, Result | None], Any], ...] = ()
    dedup: Annotated[
        bool,
        Flag(
            "--dedup/--no-dedup",
            help="Send identical GET/HEAD requests that are in flight together once (by "
            "default N items are N requests).",
        ),
    ] = False
    quota_headers: Annotated[
        bool,
        Flag(
            "--quota-headers/--no-quota-headers",
            help="When a host's rate-limit headers (X-RateLimit-Remaining/-Reset, RateLimit-*, "
            "the IETF RateLimit field) say its quota is spent, hold its new attempts until the "
            "reset; a 403 saying so is retried after it.",
        ),
    ] = True
    expect: Annotated[
        Expect, Flag("--expect", help="How to read bodies; bytes are written as base64."), HONOURED
    ] = "json"
    headers: Annotated[
        dict[str, str] | None,
        Takes(Mapping[str, str] | None),
        Flag(
            "--header",
            short="-H",
            metavar="'Name: value'",
            parse=header_lines,
            help="Header for every request (repeatable). Values are never logged or written "
            "out, and never sent to another host on a redirect.",
        ),
        HONOURED,
    ] = None
    secret_headers: Annotated[
        tuple[str, ...],
        Flag(
            "--secret-header",
            metavar="NAME",
            parse=header_names,
            help="Treat this item header as a secret too, like Authorization (repeatable).",
        ),
        HONOURED,
    ] = ()
    # Query parameters whose values are secret, besides redact.SECRET_PARAMS (api_key, token…).
    secret_params: Annotated[
        tuple[str, ...],
        Flag(
            "--secret-param",
            metavar="NAME",
            help="Treat this query parameter's value as a secret too, like api_key, token or "
            "sig (repeatable; names are case-insensitive).",
        ),
        HONOURED,
    ] = ()
    max_bytes: Annotated[
        int,
        Flag(
            "--max-bytes",
            metavar="BYTES",
            help="A larger body fails as invalid_body; with --paginate, an item's pages "
            "together are bounded the same (its data keeps the pages within it).",
        ),
        HONOURED,
    ] = Field(default=32 * 2**20, ge=1)
    # What is retried (besides what each error kind says): the statuses, as text ("429,
    # 502-504", "5xx") or numbers, and ``retry_if(status_code, error_kind)`` -> True (retry),
    # False (final) or None (as the statuses and the kind say).
    retry_statuses: Annotated[
        str | frozenset[int],
        Takes(str | Collection[int]),
        Flag(
            "--retry-statuses",
            metavar="CODES",
            parse=statuses_text,
            help="The HTTP statuses retried, e.g. 429,502-504 or 5xx (none: no status). "
            "Timeouts and dropped connections are retried whatever this says, and so is a 403 "
            "whose Retry-After or rate-limit headers say the quota is spent.",
        ),
        HONOURED,
    ] = RETRY_STATUSES
    retry_if: Annotated[RetryIf | None, HONOURED] = None
    # Tokens that expire (see auth.py): a callable returning the token's headers, called again
    # for each refresh after a 401, or a requests AuthBase applied to each request.
    auth: Annotated[Any, Takes(Auth | None)] = None

    @property
    def slots(self) -> int | None:
        return self.per_host

    @property
    def items_shown(self) -> bool:
        """Whether each item must be a RequestSpec to be shown to a hook, a fallback, a cost or
        the spend cap's prices."""
        shown = (self.on_attempt, self.cost, self.spend_cap)
        return bool(self.fallbacks) or any(option is not None for option in shown)

    def secrets(self) -> Secrets:
        """The run's secrets: its headers and declared names, and the Redis URL's password."""
        return Secrets.of(
            self.headers, self.secret_headers, self.secret_params, _redis_password(self.limits)
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

    @model_validator(mode="after")
    def _spend_reserved(self) -> FetchOptions:
        if self.max_cost is not None and self.hedge_after is not None:
            raise ValueError(
                "max_cost (--max-cost) cannot reserve the second copy hedge_after "
                "(--hedge-after) sends: give one of them"
            )
        return self

    @model_validator(mode="after")
    def _batch_options_known(self) -> FetchOptions:
        if self.batch_api is None:
            given = [
                name
                for name in _BATCH_ONLY
                if name in self.model_fields_set and getattr(self, name) not in (None, False)
            ]
            if given:
                raise ValueError(f"{', '.join(given)} go with batch_api (--batch-api)")
            return self
        refused = self._not_for_batches()
        if refused:
            raise ValueError(
                f"batch_api (--batch-api) sends each row once through the provider's batch "
                f"endpoint: {', '.join(sorted(refused))} cannot apply to it"
            )
        return self

    def _not_for_batches(self) -> list[str]:
        """The options given that a batch's rows cannot honour (what a live lane sends, with
        lanes "auto" or "live", takes every live option)."""
        refused = []
        if self.lanes == "batch":
            given = self.model_fields_set - _IN_BATCHES
            refused = [name for name in given if getattr(self, name) not in (None, False, ())]
        if self.expect in ("text", "bytes") and self.lanes != "live":
            refused.append(f"expect={self.expect}")  # (a row's answer comes as JSON in its line)
        return refused

    @model_validator(mode="after")
    def _lanes_planned(self) -> FetchOptions:
        if self.lanes == "auto" and self.deadline is None:
            raise ValueError(
                "lanes='auto' (--lanes auto) plans the lanes by the deadline: give deadline "
                "(--deadline)"
            )
        if self.live_latency is not None and self.lanes != "auto":
            raise ValueError("live_latency (--live-latency) goes with lanes='auto' (--lanes auto)")
        return self

    @model_validator(mode="after")
    def _batch_priced(self) -> FetchOptions:
        if self.batch_api is not None and self.prices is not None and self.prices.batch is None:
            raise ValueError(
                "max_cost (--max-cost) with batch_api (--batch-api) prices each row at the "
                'batch endpoint\'s factor: give it in prices (--prices) as "batch", e.g. 0.5'
            )
        return self

    _sendable_headers = field_validator("headers")(staticmethod(sendable_headers))

    @field_validator("retry_statuses")
    @classmethod
    def _statuses_known(cls, value: str | frozenset[int]) -> str | frozenset[int]:
        parse_statuses(value)
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


# What a run through a batch endpoint honours: the families of its calls' connection and of
# the batch endpoint, and the options marked HONOURED (its rows' decoding and Results, its
# control calls' retry policy, the wait's deadline and budget); what only it takes: the batch
# endpoint's family, but the switch.
_IN_BATCHES = (
    frozenset(Connection.model_fields)
    | frozenset(BatchApi.model_fields)
    | frozenset(Spend.model_fields)
    | frozenset(
        name
        for name, field in FetchOptions.model_fields.items()
        if any(isinstance(mark, Honoured) for mark in field.metadata)
    )
)
_BATCH_ONLY = sorted(set(BatchApi.model_fields) - {"batch_api"})


def _redis_password(limits: object) -> list[str]:
    url = getattr(limits, "url", limits)
    try:
        password = urlsplit(url).password if isinstance(url, str) else None
    except ValueError:
        return []
    return [password] if password else []


# The call options' defaults, for the explicit keywords of ``call`` and ``Limits``.
CALL_DEFAULT = CallOptions()

OptionsT = TypeVar("OptionsT", bound=EngineOptions)


def build(model: type[OptionsT], **values: object) -> OptionsT:
    """Validate options, turning pydantic's report into one ValueError line."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise ValueError(f"invalid option: {one_line(exc)}") from None


def taken(model: type[OptionsT], given: Mapping[str, object], taker: str) -> OptionsT:
    """The options a function took as ``**options``: a TypeError for a keyword it does not
    take, as for a named parameter, then ``build``'s ValueError for a bad value."""
    for name in given:
        if name not in model.model_fields:
            raise TypeError(f"{taker}() got an unexpected keyword argument {name!r}")
    return build(model, **given)


def spelled_out(settings: type, model: type[EngineOptions]) -> Callable[[F], F]:
    """Show the decorated function's ``**options: Unpack[settings]`` to ``help()`` and
    ``inspect.signature`` as the options themselves: keyword-only, typed as ``settings``
    types them (as the model does for one settings.py does not have yet: the test that
    generates it says so), with ``model``'s defaults."""
    types = typing.get_type_hints(settings)
    options = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=field.default,
            annotation=types.get(name, field.annotation),
        )
        for name, field in model.model_fields.items()
    ]

    def spell(fn: F) -> F:
        signature = inspect.signature(fn)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        fn.__signature__ = signature.replace(parameters=[*own, *options])  # type: ignore[attr-defined]
        return fn

    return spell
