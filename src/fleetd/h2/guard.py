"""
What one HTTP/2 client may cost the tink listener [A4] (issue 17).

The listener has no client certificate, so anyone who reaches 42113 may
open connections. L{ConnectionGuard} holds one connection's budgets;
L{H2ServerProtocol} asks it and acts. Policy only, no I/O:

- B{Wasted streams} (the CVE-2023-44487 "rapid reset" pattern): a stream
  the client resets before fleetd answered, a stream fleetd refused, and a
  request that ended without a whole gRPC message each cost one unit of
  C{streamBudget}; a call answered after a whole request earns one back.
  The unit that empties the budget gets the connection
  GOAWAY(ENHANCE_YOUR_CALM) and closes it. The proxy opens the upstream
  stream only for a whole request (L{fleetd.h2.proxy}), so a reset
  stream costs tink-server nothing and an attacking connection reaches it
  with at most the budget.
- B{New streams per source}: every connection of one source (an IPv6 /64
  counts as one, L{sourceKey}) draws from one token bucket
  (L{SourceStreams}); a stream over it is refused (REFUSED_STREAM, which
  gRPC clients retry) and counts as wasted. A source whose connection was
  closed for abuse opens no new connection for a while (refused when
  accepted, before any TLS work: L{SourceStreams.admits}), 1 s at first,
  doubling with each repeat up to C{maxPenalty}.
- B{Control frames}: PING and SETTINGS frames (each makes fleetd write an
  ACK) draw from a per-connection token bucket; past it, GOAWAY
  (ENHANCE_YOUR_CALM) and close.
- B{Every frame} (issue 26), whatever its type and whether or not it
  carries bytes, draws from a second, larger bucket (L{frames}), counted
  before h2 parses it (L{fleetd.h2.frames.FrameMeter}); a call answered
  after a whole request gives a few back, so a busy honest connection is
  never cut, while frames that ask for nothing only spend; past it, GOAWAY
  (ENHANCE_YOUR_CALM), and the rest of what the client sent is dropped
  unparsed. A header block left open is bounded in bytes (the listener's
  C{SETTINGS_MAX_HEADER_LIST_SIZE}) and in time (C{headerTimeout}).
- B{Answers held for the client's window} (issue 26): response bytes the
  client's flow-control window (or its unread socket) holds in fleetd are
  owed to the connection (L{owe}); past C{maxOwedBytes}, or when nothing
  of them could be sent for C{windowTimeout}, GOAWAY(ENHANCE_YOUR_CALM).
  The upstream hop credits a stream only once its bytes were forwarded,
  so what one connection owes never holds back another's answers.
- B{Unread replies}: while the transport's write buffer is full fleetd
  stops reading (the protocol is the transport's streaming producer), and
  what it would still write is held here; more than C{maxUnreadBytes}
  held closes the connection at once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime

from fleetd.config import TinkSettings
from fleetd.ratelimit import RateLimiter
from fleetd.sources import sourceKey


@dataclass(frozen=True)
class H2Limits:
    """The per-connection abuse limits (defaults: see docs/decisions.md)."""

    streamBudget: int = TinkSettings.stream_budget
    controlBurst: float = 100.0
    controlRate: float = 10.0
    maxUnreadBytes: int = 64 * 1024
    # Every frame: a tink agent sends a few per call; a 4 MiB request is
    # about 300 (DATA of 16 KiB and the WINDOW_UPDATEs it earns).
    frameBurst: float = 1000.0
    frameRate: float = 200.0
    # A call answered after a whole request gives this many back: a busy
    # honest connection pays for its frames with calls (one costs 2 to 5).
    frameRefund: float = 8.0
    # An open header block (HEADERS without END_HEADERS) must end within
    # this long; its bytes are bounded by the max header list size.
    headerTimeout: float = 5.0
    # Response bytes held for streams stalled on the client's window: at
    # most this many per connection, for at most windowTimeout seconds
    # without any of them leaving.
    maxOwedBytes: int = 256 * 1024
    windowTimeout: float = 10.0
    # After its GOAWAY fleetd reads nothing more and gives the client this
    # long to read it and close before the connection is cut off.
    closeGrace: float = 1.0


class SourceStreams:
    """New streams per source, across all of a listener's connections, and
    the penalties of sources told to calm down."""

    def __init__(
        self,
        clock: IReactorTime,
        *,
        rate: float,
        burst: float,
        maxPenalty: float = 60.0,
        maxSources: int = 65536,
    ) -> None:
        # The global bucket never binds: only sources are limited here.
        self._limiter = RateLimiter(
            clock,
            rate=rate,
            burst=burst,
            globalRate=1e12,
            globalBurst=1e12,
            maxSources=maxSources,
        )
        self._clock = clock
        self._maxPenalty = maxPenalty
        self._maxSources = maxSources
        # source -> (penalised until, its latest penalty in seconds)
        self._penalties: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, source: str) -> bool:
        """Whether C{source} (a L{sourceKey}) may open one more stream."""
        return self._limiter.allow(source)

    def penalize(self, source: str) -> float:
        """C{source}'s connection was closed for abuse: refuse its new
        connections for 1 s, or twice its last penalty if that one ended
        less than C{maxPenalty} ago. Returns the penalty in seconds."""
        now = self._clock.seconds()
        until, last = self._penalties.pop(source, (0.0, 0.0))
        seconds = 1.0
        if now < until + self._maxPenalty:
            seconds = min(self._maxPenalty, max(1.0, 2 * last))
        self._penalties[source] = (now + seconds, seconds)
        if len(self._penalties) > self._maxSources:
            self._penalties.popitem(last=False)
        return seconds

    def admits(self, source: str) -> bool:
        """Whether a new connection from C{source} may be accepted."""
        penalty = self._penalties.get(source)
        return penalty is None or self._clock.seconds() >= penalty[0]


class Bucket:
    """A token bucket of one connection: C{burst} tokens, C{rate} a second."""

    __slots__ = ("_at", "_clock", "_rate", "burst", "tokens")

    def __init__(self, clock: IReactorTime, rate: float, burst: float) -> None:
        self._clock = clock
        self._rate = rate
        self.burst = burst
        self.tokens = burst
        self._at = clock.seconds()

    def spend(self, count: float) -> bool:
        """Take C{count} tokens; whether the bucket is now overdrawn."""
        now = self._clock.seconds()
        if now > self._at:
            refill = (now - self._at) * self._rate
            self.tokens = min(self.burst, self.tokens + refill)
            self._at = now
        self.tokens -= count
        return self.tokens < 0

    def give(self, count: float) -> None:
        """Put C{count} tokens back (up to the burst)."""
        self.tokens = min(self.burst, self.tokens + count)


class ConnectionGuard:
    """One connection's budgets (see the module docstring)."""

    __slots__ = (
        "_clock",
        "_control",
        "_frames",
        "_limits",
        "_sources",
        "held",
        "owed",
        "owedSince",
        "paused",
        "source",
        "wasted",
    )

    def __init__(
        self,
        limits: H2Limits,
        clock: IReactorTime,
        host: str,
        sources: SourceStreams | None = None,
    ) -> None:
        self._limits = limits
        self._clock = clock
        self._sources = sources
        self.source = sourceKey(host)
        self.wasted = 0
        self._control = Bucket(clock, limits.controlRate, limits.controlBurst)
        self._frames = Bucket(clock, limits.frameRate, limits.frameBurst)
        self.paused = False
        self.held = bytearray()
        self.owed = 0
        self.owedSince = 0.0

    def waste(self) -> bool:
        """A stream was wasted; whether the connection is now past its
        budget."""
        self.wasted += 1
        return self.wasted >= self._limits.streamBudget

    def completed(self) -> None:
        """A call was answered after a whole request: one unit of the
        stream budget back, and L{H2Limits.frameRefund} frames."""
        if self.wasted:
            self.wasted -= 1
        self._frames.give(self._limits.frameRefund)

    def allowStream(self) -> bool:
        """Whether this connection's source may open a stream now."""
        return self._sources is None or self._sources.allow(self.source)

    def controlFrame(self) -> bool:
        """A PING or SETTINGS arrived; whether the rate is exceeded."""
        return self._control.spend(1)

    def frames(self, count: int) -> bool:
        """C{count} frames arrived; whether the connection is now past its
        frame budget."""
        return self._frames.spend(count)

    def owe(self, delta: int, sent: bool) -> bool:
        """Response bytes held for the client's window changed by C{delta}
        (C{sent}: some left); whether more is held than the bound. The
        window deadline counts from when bytes were first held, or last
        left while some stayed held."""
        if (delta > 0 and self.owed <= 0) or sent:
            self.owedSince = self._clock.seconds()
        self.owed += delta
        return self.owed > self._limits.maxOwedBytes

    def windowLeft(self) -> float | None:
        """Seconds left before held bytes pass the window deadline (at most
        0), or L{None} when nothing is held."""
        if self.owed <= 0:
            return None
        elapsed = self._clock.seconds() - self.owedSince
        return self._limits.windowTimeout - elapsed

    def hold(self, data: bytes) -> bool:
        """Keep C{data} while paused; whether too much is now unread."""
        self.held += data
        return len(self.held) > self._limits.maxUnreadBytes

    def release(self) -> bytes:
        """Resume: what was held, to write now."""
        self.paused = False
        held, self.held = bytes(self.held), bytearray()
        return held
