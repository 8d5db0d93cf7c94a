"""Limits shared through Redis (the optional ``redis`` extra), for several processes or machines.

The interfaces of ``limits.shared``, as the in-process limits have them: a window's log,
per-host slots, cooldowns and circuit breakers, each kept in Redis under one namespace (the
shared quota). Every decision is one atomic Lua script on the Redis server's clock, so
processes on machines whose clocks disagree still agree on the limits. Slots are leases with a
TTL that a holder renews while it holds them: a process killed with SIGKILL gives its slots
back within the TTL.

When Redis cannot be reached, every call raises LimitsUnavailable; the gates then wait and
ask again (fail closed) — never send without the limits.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..core.redact import Secrets
from ..limits.rates import Window
from ..limits.shared import BreakerSettings, BreakerState, LimitsUnavailable, SpendStore
from ..limits.window import INFINITE

# The longest an attempt is taken to run, for forgetting the entries of a process that died.
_LONGEST_ATTEMPT = 3600.0

log = logging.getLogger("batchsync")


def _masked(url: str, text: str) -> str:
    """``text`` with the Redis URL's userinfo and password masked wherever they are."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return Secrets.of(values=[password] if password else []).text(text)


T = TypeVar("T")

# Server time in seconds, as a float, inside a script.
_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1000000 "
# Keep every key at least ``seconds`` more, never less than another entry already needs:
# whatever the order of takes, a short one beside a long one in flight shortens nothing.
_KEEP = """
local function keep(seconds)
  seconds = math.ceil(seconds) + 60
  for _, key in ipairs(KEYS) do
    if redis.call('TTL', key) < seconds then redis.call('EXPIRE', key, seconds) end
  end
end
"""


def _timed(script: str) -> str:
    return _NOW + script


def _timed_keeping(script: str) -> str:
    return _NOW + _KEEP + script


# A window's log (see ``window``): KEYS[1] a hash of ``held`` (every entry's amount) and
# ``paced`` (when the pace lets the next go), KEYS[2] the entries in flight (id -> when a
# process that died is forgotten), KEYS[3] the ended ones (id -> when they leave), KEYS[4]
# each entry's amount. Returns '0' when taken, else the seconds to wait ('-1': until an
# attempt in flight ends).
WINDOW_TAKE = _timed_keeping("""
local amount, count, interval = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local id, hold = ARGV[4], tonumber(ARGV[5])
local held = tonumber(redis.call('HGET', KEYS[1], 'held')) or 0
local paced = tonumber(redis.call('HGET', KEYS[1], 'paced')) or now
for _, log in ipairs({KEYS[3], KEYS[2]}) do
  local gone = redis.call('ZRANGEBYSCORE', log, '-inf', now)
  for _, old in ipairs(gone) do
    held = held - (tonumber(redis.call('HGET', KEYS[4], old)) or 0)
    redis.call('HDEL', KEYS[4], old)
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', log, '-inf', now) end
end
if held < 0 then held = 0 end
redis.call('HSET', KEYS[1], 'held', tostring(held))
local wait = paced - now
local need = held + amount - count
if need > 0 and held > 0 then
  local room = -1
  local ended = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
  for i = 1, #ended, 2 do
    need = need - (tonumber(redis.call('HGET', KEYS[4], ended[i])) or 0)
    if need <= 0 then room = tonumber(ended[i + 1]) - now break end
  end
  if room < 0 then return '-1' end
  if room > wait then wait = room end
end
if wait > 0 then return tostring(wait) end
redis.call('HSET', KEYS[4], id, tostring(amount))
redis.call('ZADD', KEYS[2], now + hold, id)
redis.call('HSET', KEYS[1], 'held', tostring(held + amount),
  'paced', tostring(math.max(paced, now) + amount * interval))
keep(hold)
return '0'
""")

# An entry's end (ARGV: its id, what it used, its period, how: 'finish', 'settle' (what it
# used, whatever it is, the pace it did not use given back at ARGV[5] a unit) or 'cancel').
WINDOW_END = _timed_keeping("""
local id, used, period = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('ZREM', KEYS[2], id) == 0 then return 0 end
local amount = tonumber(redis.call('HGET', KEYS[4], id)) or 0
if ARGV[4] == 'cancel' then
  redis.call('HDEL', KEYS[4], id)
  redis.call('HINCRBYFLOAT', KEYS[1], 'held', -amount)
  return 1
end
if ARGV[4] == 'settle' and used < amount then
  local paced = tonumber(redis.call('HGET', KEYS[1], 'paced'))
  if paced then
    redis.call('HSET', KEYS[1], 'paced', tostring(paced - (amount - used) * tonumber(ARGV[5])))
  end
end
if used > amount or ARGV[4] == 'settle' then
  redis.call('HSET', KEYS[4], id, tostring(used))
  redis.call('HINCRBYFLOAT', KEYS[1], 'held', used - amount)
end
redis.call('ZADD', KEYS[3], now + period, id)
keep(period)
return 1
""")

TAKE_LEASE = _timed("""
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 60)
return 1
""")

RENEW_LEASES = _timed("""
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
end
return #KEYS
""")

HOLD = """
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then redis.call('SET', KEYS[1], '1', 'PX', ms) end
return 1
"""

# A host's breaker: a hash (KEYS[1]) with ``failures``, ``open_until`` and ``probe_until``
# (server time), and its window (KEYS[2]), a list of its last counted attempts, newest first:
# '1' a failure, '0' a success. Opening clears the window; the probe's success deletes both.
BREAKER_CHECK = _timed("""
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until'))
if not open_until then return {'closed', '0'} end
if now < open_until then return {'open', tostring(open_until - now)} end
local probe_until = tonumber(redis.call('HGET', KEYS[1], 'probe_until')) or 0
if probe_until > now then return {'probing', '0'} end
redis.call('HSET', KEYS[1], 'probe_until', tostring(now + tonumber(ARGV[1])))
return {'probe', '0'}
""")

BREAKER_RECORD = _timed("""
local outcome, probe = ARGV[1], ARGV[2] == '1'
local ratio, window, min_calls = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local reset, keep = tonumber(ARGV[6]), tonumber(ARGV[7])
local open_until = redis.call('HGET', KEYS[1], 'open_until')
if probe then
  if not open_until then return 0 end
  redis.call('HDEL', KEYS[1], 'probe_until')
  if outcome == '1' then
    redis.call('HSET', KEYS[1], 'open_until', tostring(now + reset))
    redis.call('EXPIRE', KEYS[1], keep)
  elseif outcome == '0' then
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.call('LPUSH', KEYS[2], '0')
    redis.call('EXPIRE', KEYS[2], keep)
  end
  return 0
end
if outcome == '' or open_until then return 0 end
local failures = tonumber(redis.call('HGET', KEYS[1], 'failures')) or 0
local calls = redis.call('LPUSH', KEYS[2], outcome)
if outcome == '1' then failures = failures + 1 end
if calls > window then
  if redis.call('RPOP', KEYS[2]) == '1' then failures = failures - 1 end
  calls = window
end
if calls >= math.min(min_calls, window) and failures > 0 and failures >= ratio * calls then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'failures', '0', 'open_until', tostring(now + reset))
  redis.call('EXPIRE', KEYS[1], keep)
  return 1
end
redis.call('HSET', KEYS[1], 'failures', tostring(failures))
redis.call('EXPIRE', KEYS[1], keep)
redis.call('EXPIRE', KEYS[2], keep)
return 0
""")

# A breaker's keys outlive a day without attempts at most.
_BREAKER_KEEP_SECONDS = 86400
# The spend cap's ledger (see ``limits.spend``): KEYS[1] what was spent, KEYS[2] the
# reservations (id -> "amount when"), in nano-dollars (the cap rounded down, every amount
# up: exact in a Lua number up to some nine million dollars). A reservation older than any
# attempt can last (ARGV[4]) was its process's that died: it is counted spent. The keys live
# a week past the last reservation. Returns 1 when reserved, 0 when only what is reserved
# stands in the way, -1 when what was spent does.
SPEND_RESERVE = _timed_keeping("""
local spent, reserved = tonumber(redis.call('GET', KEYS[1]) or '0'), 0
local held = redis.call('HGETALL', KEYS[2])
for i = 1, #held, 2 do
  local amount, since = string.match(held[i + 1], '(%d+) ([%d.]+)')
  if now - tonumber(since) > tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[2], held[i])
    spent = redis.call('INCRBY', KEYS[1], amount)
  else
    reserved = reserved + tonumber(amount)
  end
end
local amount, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
if spent + amount > cap then return -1 end
if spent + reserved + amount > cap then return 0 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[1] .. ' ' .. now)
redis.call('SETNX', KEYS[1], 0)
keep(604800)
return 1
""")
# A reservation (ARGV[1]) turned into what it spent (ARGV[2]), unless counted spent already;
# counted before it is dropped, so that a count Redis refuses leaves the reservation standing.
SPEND_SETTLE = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  redis.call('INCRBY', KEYS[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return redis.call('GET', KEYS[1]) or '0'
"""
# What was spent is at least ARGV[1] (what a process's journal says it spent).
SPEND_FLOOR = """
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return redis.call('GET', KEYS[1])
"""
_NANO = 1000  # pico-dollars a nano-dollar


def _client_for(url: str) -> tuple[Any, tuple[type[BaseException], ...]]:
    """A client of the server at ``url``, and the errors of failing to reach it."""
    try:
        import redis
    except ImportError:
        raise ValueError(
            "shared limits need the redis client: pip install 'batchsync[redis]'"
        ) from None
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    return client, (redis.RedisError, OSError)


class RedisLimits:
    """A Redis server (``redis://host:6379/0``) holding the limits of one ``namespace``.

    Connecting checks that the server answers; a server that does not is a ValueError.
    """

    def __init__(self, url: str, namespace: str = "batchsync", lease_ttl: float = 10.0) -> None:
        if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(_masked(url, f"not a Redis URL: {url}"))
        if lease_ttl <= 0:
            raise ValueError(f"lease_ttl must be a positive number of seconds, got {lease_ttl}")
        self.url, self.namespace, self.lease_ttl = url, namespace, lease_ttl
        self.redis, self._errors = _client_for(url)
        try:
            self.redis.ping()
        except Exception as exc:  # every failure to reach it is the same to the caller
            raise ValueError(_masked(url, f"cannot reach Redis at {url}: {exc}")) from None

    def key(self, *parts: str) -> str:
        return ":".join(("batchsync", self.namespace, *parts))

    def guarded(self, action: Callable[[], T]) -> T:
        """Run a Redis call; a failure to reach Redis becomes LimitsUnavailable."""
        try:
            return action()
        except self._errors as exc:
            raise LimitsUnavailable(_masked(self.url, f"Redis at {self.url}: {exc}")) from exc

    def script(self, source: str) -> Any:
        return self.redis.register_script(source)

    def window(self, name: str) -> RedisWindow:
        return RedisWindow(self, name)

    def slots(self, limit: int) -> RedisLeases:
        return RedisLeases(self, limit)

    def cooldowns(self) -> RedisCooldowns:
        return RedisCooldowns(self)

    def breaker(self, settings: BreakerSettings) -> RedisBreaker:
        return RedisBreaker(self, settings)

    def ledger(self, cap: int) -> RedisLedger:
        return RedisLedger(self, cap)


class RedisLedger:
    """The spend cap's ledger (see limits.shared.SpendLedger) shared by every process of the
    namespace: what any of them spent and reserved counts for all, on the server for as long
    as it keeps its data. A process's journal keeps its own reservations too, as a record."""

    poll = 0.02

    def __init__(self, limits: RedisLimits, cap: int) -> None:
        self._limits = limits
        self.cap = cap
        self._keys = [limits.key("spend", "spent"), limits.key("spend", "held")]
        self._reserve = limits.script(SPEND_RESERVE)
        self._settle = limits.script(SPEND_SETTLE)
        self._floor = limits.script(SPEND_FLOOR)
        self._spent = 0
        self._store: SpendStore | None = None

    @property
    def spent(self) -> int:
        """What was spent, as the server last said (pico-dollars)."""
        return self._spent

    def reserve(self, amount: int) -> object | bool | None:
        mark = uuid.uuid4().hex
        args = [-(-amount // _NANO), self.cap // _NANO, mark, _LONGEST_ATTEMPT]
        done = int(self._limits.guarded(lambda: self._reserve(keys=self._keys, args=args)))
        if done == -1:
            spent = self._limits.guarded(lambda: self._limits.redis.get(self._keys[0]))
            self._spent = int(spent or 0) * _NANO
        if done != 1:
            return None if done == 0 else False
        return mark, None if self._store is None else self._store.reserve(amount)

    def settle(self, mark: object, reserved: int, spent: int) -> None:
        assert isinstance(mark, tuple)
        shared, kept = mark
        args = [shared, -(-spent // _NANO)]
        total = self._limits.guarded(lambda: self._settle(keys=self._keys, args=args))
        self._spent = int(total) * _NANO
        if kept is not None and self._store is not None:
            self._store.settle(kept, spent)

    def wait(self, seconds: float) -> None:
        threading.Event().wait(min(seconds, self.poll))

    def keep(self, store: SpendStore | None) -> None:
        """Keep this process's reservations in ``store`` too, and count at least what it says
        was spent (the server may have lost what a journal kept)."""
        self._store = store
        if store is not None:
            args = [-(-store.total() // _NANO)]
            total = self._limits.guarded(lambda: self._floor(keys=self._keys[:1], args=args))
            self._spent = int(total) * _NANO


class RedisWindow:
    """A window's shared log (see window.WindowLimiter), kept under ``name``: every process's
    attempts in one log, on the Redis server's clock. Turns are not kept in line across
    processes; a waiter looks again every ``poll`` seconds. An entry in flight is forgotten
    once its attempt could no longer be running (its process died)."""

    poll = 0.02

    def __init__(self, limits: RedisLimits, name: str) -> None:
        self._limits = limits
        self._keys = [limits.key(name, part) for part in ("state", "flying", "ended", "amounts")]
        self._take = limits.script(WINDOW_TAKE)
        self._end = limits.script(WINDOW_END)
        self._periods: dict[str, tuple[float, float]] = {}  # (each entry's period, pace)

    def take(
        self, amount: float, window: Window, turn: threading.Event, longest: float
    ) -> tuple[object | None, float]:
        entry = uuid.uuid4().hex
        hold = min(longest, _LONGEST_ATTEMPT) + window.period
        args = [amount, window.count, window.interval, entry, hold]
        wait = float(self._limits.guarded(lambda: self._take(keys=self._keys, args=args)))
        if wait == 0:
            self._periods[entry] = window.period, window.interval
            return entry, 0.0
        return None, INFINITE if wait < 0 else wait

    def finish(self, entry: object, used: float | None, *, exact: bool = False) -> None:
        self._ended(entry, used or 0, "settle" if exact and used is not None else "finish")

    def cancel(self, entry: object) -> None:
        self._ended(entry, 0, "cancel")

    def _ended(self, entry: object, used: float, how: str) -> None:
        assert isinstance(entry, str)
        period, interval = self._periods.pop(entry, (0.0, 0.0))
        args = [entry, used, period, how, interval]
        self._limits.guarded(lambda: self._end(keys=self._keys, args=args))

    def withdraw(self, turn: threading.Event) -> None:
        """No line is kept."""

    def recheck(self) -> None:
        """Nothing to wake: every waiter looks again every ``poll`` seconds."""

    def queued(self) -> bool:
        return False


class RedisLeases:
    """Per-host slots as leases (see limits.SlotPool): a sorted set per host, lease id ->
    expiry on the server's clock. A thread renews this process's leases every third of the
    TTL; leases of a process that died simply expire."""

    def __init__(self, limits: RedisLimits, limit: int) -> None:
        self._limits = limits
        self._limit = limit
        self._take = limits.script(TAKE_LEASE)
        self._renew = limits.script(RENEW_LEASES)
        self._held: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._pause = threading.Event()

    def enter(self, key: str, timeout: float, stop: threading.Event | None = None) -> bool:
        lease = uuid.uuid4().hex
        slots = self._limits.key("slots", key)
        args = [self._limit, self._limits.lease_ttl, lease]
        took = self._limits.guarded(lambda: self._take(keys=[slots], args=args))
        if not took:
            # Slots free up in another process: nothing to wake us, so look again shortly.
            self._pause.wait(min(timeout, 0.02))
            return False
        with self._lock:
            self._held.setdefault(key, []).append(lease)
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew_while_held, name="batchsync-leases", daemon=True
                )
                self._renewer.start()
        return True

    def wake(self) -> None:
        """Nothing to wake: a waiter looks again within 0.02 s."""

    def leave(self, key: str) -> None:
        with self._lock:
            leases = self._held.get(key)
            lease = leases.pop() if leases else None
            if leases == []:
                del self._held[key]
        if lease is not None:
            slots = self._limits.key("slots", key)
            self._limits.guarded(lambda: self._limits.redis.zrem(slots, lease))

    def _renew_while_held(self) -> None:
        """Renew this process's leases every third of the TTL; end when none are held."""
        while not self._pause.wait(self._limits.lease_ttl / 3):
            with self._lock:
                held = [(key, lease) for key, leases in self._held.items() for lease in leases]
                if not held:
                    self._renewer = None
                    return
            keys = [self._limits.key("slots", key) for key, _ in held]
            args = [self._limits.lease_ttl, *(lease for _, lease in held)]
            try:
                self._limits.guarded(partial(self._renew, keys=keys, args=args))
            except LimitsUnavailable as exc:
                log.warning("cannot renew slot leases: %s", exc)


class RedisCooldowns:
    """Cooldowns as keys with a millisecond expiry (see limits.CooldownBoard)."""

    def __init__(self, limits: RedisLimits) -> None:
        self._limits = limits
        self._hold = limits.script(HOLD)

    def hold(self, key: str, seconds: float) -> None:
        name = self._limits.key("cooldown", key)
        milliseconds = max(1, int(seconds * 1000))
        self._limits.guarded(lambda: self._hold(keys=[name], args=[milliseconds]))

    def remaining(self, key: str) -> float:
        name = self._limits.key("cooldown", key)
        milliseconds = int(self._limits.guarded(lambda: self._limits.redis.pttl(name)))
        return max(milliseconds, 0) / 1000


class RedisBreaker:
    """Circuit breakers shared by every process, with the semantics of the in-process
    ``limits.breaker.CircuitBreaker``: every process counts into one window per host and is
    held by the same break. The probe is a token with an expiry (the lease TTL): a process that
    dies while probing gives it up."""

    def __init__(self, limits: RedisLimits, settings: BreakerSettings) -> None:
        self._limits = limits
        self.settings = settings
        self._check = limits.script(BREAKER_CHECK)
        self._record = limits.script(BREAKER_RECORD)
        self.opened = 0
        # (`+=` reads, then writes: on a free-threaded build two at once could count one)
        self._counting = threading.Lock()

    def _keys(self, key: str) -> list[str]:
        return [self._limits.key("breaker", key), self._limits.key("breaker", key, "window")]

    def check(self, key: str) -> tuple[BreakerState, float]:
        keys, args = self._keys(key), [self._limits.lease_ttl]
        state, wait = self._limits.guarded(lambda: self._check(keys=keys, args=args))
        text = state.decode() if isinstance(state, bytes) else str(state)
        assert text in ("closed", "probe", "open", "probing")
        return text, float(wait)  # type: ignore[return-value]

    def record(self, key: str, failed: bool | None, probe: bool) -> None:
        keys, settings = self._keys(key), self.settings
        outcome = "" if failed is None else str(int(failed))
        numbers = (settings.ratio, settings.window, settings.min_calls, settings.reset)
        args = [outcome, int(probe), *numbers, _BREAKER_KEEP_SECONDS]
        if self._limits.guarded(lambda: self._record(keys=keys, args=args)):
            with self._counting:
                self.opened += 1

    def abandon(self, key: str, probe: bool) -> None:
        if probe:
            self.record(key, None, probe=True)
