"""
Response-rate limiting (RRL) for DNS over UDP (issue 8, item 12; design.md, Listeners).

No I/O here. L{ResponseRateLimiter} keeps one account per source prefix
(L{fleetd.sources}: IPv4 /24 and IPv6 /56 by default) and kind of response:
answers for the enrollment name, and everything else (refusals, NXDOMAIN,
NODATA, errors). So a flood of other names never uses up the budget of the
name nodes need, even from their own prefix. Each account is a token
bucket (kept as a theoretical arrival time, GCRA): C{burst} responses at
once, then C{rate} a second.

Over the limit a response is dropped, except that every C{slip}-th one of
an account is sent truncated (TC=1, question only), as BIND and Knot do: a
real resolver whose address is being spoofed retries over TCP, which is not
rate limited. C{slip} 0 drops them all, 1 truncates them all.

The table of accounts is bounded (C{tableSize}): when it is full, accounts
whose bucket has refilled are swept (at most once a second), and if none
can go, the oldest account makes room.
"""

from __future__ import annotations

import struct
from typing import Final

from twisted.internet.interfaces import IReactorTime

from fleetd.config import DNSRateLimit
from fleetd.sources import SourcePrefix

SEND: Final = 0
DROP: Final = 1
SLIP: Final = 2

_TC: Final = 0x0200
_CD: Final = 0x0010


def slipReply(data: bytes) -> bytes | None:
    """
    The truncated reply to query C{data}: its header with QR and TC set, and
    its question when it has one that can be read without decompression.
    C{None} for packets that get no reply at all.
    """
    n = len(data)
    if n < 12 or data[2] & 0x80:
        return None
    flags = 0x8000 | _TC | ((data[2] << 8) & 0x7900) | (data[3] & _CD)
    end = 0
    if data[4:6] == b"\x00\x01":
        i = 12
        while i < n:
            length = data[i]
            if length == 0:
                end = i + 5
                break
            if length > 63:
                break
            i += length + 1
        if end > n or end - 12 > 259:
            end = 0
    if end:
        return data[:2] + struct.pack("!HHHHH", flags, 1, 0, 0, 0) + data[12:end]
    return data[:2] + struct.pack("!HHHHH", flags, 0, 0, 0, 0)


class ResponseRateLimiter:
    """
    Decide, per response, whether to send it, drop it or slip it.

    @param clock: read with C{seconds()} only.
    """

    def __init__(self, settings: DNSRateLimit, clock: IReactorTime) -> None:
        self.settings = settings
        self._clock = clock
        self._prefix = SourcePrefix(settings.ipv4_prefix, settings.ipv6_prefix)
        self._interval = 1.0 / settings.rate
        self._tolerance = (settings.burst - 1.0) * self._interval
        self._slip = settings.slip
        self._size = settings.table_size
        # prefix -> [theoretical arrival time, limited responses so far]
        self._answers: dict[bytes | str, list[float]] = {}
        self._others: dict[bytes | str, list[float]] = {}
        self._swept = float("-inf")

    def __len__(self) -> int:
        """How many accounts are held."""
        return len(self._answers) + len(self._others)

    def verdict(self, host: str, answer: bool) -> int:
        """
        L{SEND}, L{DROP} or L{SLIP} for one response to C{host}: an answer
        for the enrollment name if C{answer}, else any other response.
        """
        key = self._prefix(host)
        table = self._answers if answer else self._others
        now = self._clock.seconds()
        account = table.get(key)
        if account is None:
            if len(table) >= self._size:
                self._makeRoom(table, now)
            table[key] = [now + self._interval, 0.0]
            return SEND
        tat = account[0]
        if tat < now:
            tat = now
        if tat - now <= self._tolerance:
            account[0] = tat + self._interval
            return SEND
        account[1] += 1
        if self._slip and account[1] % self._slip == 0:
            return SLIP
        return DROP

    def _makeRoom(self, table: dict[bytes | str, list[float]], now: float) -> None:
        if now - self._swept >= 1.0:
            self._swept = now
            full = [k for k, (tat, _) in table.items() if tat <= now]
            for k in full:
                del table[k]
        if len(table) >= self._size:
            del table[next(iter(table))]
