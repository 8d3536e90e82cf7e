"""
The cheap path for the answers a flood of other names gets (issue 8, item 12).

No I/O and no dnspython per packet. L{QuickAnswers} derives the reply from
the query's own bytes for:

  - REFUSED: names outside the zone, classes other than IN, AXFR/IXFR;
  - NOTIMP: meta-types (other than ANY) as QTYPE inside the zone;
  - NXDOMAIN below the apex and NODATA at the apex, each with the SOA;
  - FORMERR: a question name that is cut short, too long or has a reserved
    label type, a question without its type and class, fewer bytes than
    the record counts need (11 a record at least), trailing bytes.

It takes queries of one question with no records besides at most one OPT
(version 0, no options) at the end. Anything else (compression pointers,
EDNS options, the apex's own records, truncation) it declines with
C{None}, and the general path decides. The replies equal the general
path's byte for byte; a property test checks that.
"""

from __future__ import annotations

import struct
from typing import Final

import dns.name
import dns.rdatatype

from fleetd.dns.wire import (
    NO_QTYPE,
    OTHER_QTYPE,
    QTYPE_LABELS,
    Reply,
    headerOnly,
)

_QR: Final = 0x8000
_AA: Final = 0x0400
_RD: Final = 0x0100
_CD: Final = 0x0010
_new = tuple.__new__  # a Reply without NamedTuple's slower constructor
_MAX_PAYLOAD: Final = 1232
_TCP_LIMIT: Final = 65535

_LABELS: Final[dict[int, str]] = {
    int(dns.rdatatype.from_text(t)): t for t in QTYPE_LABELS
}
_SOA: Final = 6
_IXFR: Final = 251
_AXFR: Final = 252
_ANY: Final = 255
_HOSTMASTER: Final = b"\x0ahostmaster"
# dnspython's meta-types, but for ANY (all below 256): NOTIMP as QTYPE.
_METATYPES: Final = frozenset(
    t
    for t in range(256)
    if t != _ANY and dns.rdatatype.is_metatype(dns.rdatatype.RdataType(t))
)


class QuickAnswers:
    """
    Replies derived from the query's bytes for the zone at C{apex}.

    @param soaFields: the SOA's serial, refresh, retry, expire and minimum.
    @param apexAnswers: the QTYPEs the apex has records for (the general
        path answers those).
    """

    def __init__(
        self,
        apex: dns.name.Name,
        ttl: int,
        soaFields: tuple[int, int, int, int, int],
        apexAnswers: frozenset[int],
        minimumUdpPayload: int,
    ) -> None:
        wire = apex.to_wire()
        assert wire is not None
        self._apex = wire.lower()
        self._apexLength = len(wire)
        # Where the apex's last label starts, from the name's end, and its
        # length: most names outside the zone differ there already.
        self._lastLength = len(apex.labels[-2])
        self._lastLabel = self._lastLength + 2
        self._apexAnswers = apexAnswers
        self._minimumUdp = minimumUdpPayload
        self._soaHead = struct.pack("!HHIH", _SOA, 1, ttl, 0)[:-2]
        self._soaTail = struct.pack("!5I", *soaFields)
        self._soaAt: dict[int, bytes] = {}  # by where the apex starts: < 256
        # Flags and counts after the ID, by kind, EDNS, RD and CD.
        self._heads: dict[int, bytes] = {}
        for kind, rcode in enumerate((5, 4, 3, 0)):
            for edns in (0, 1):
                for bits in range(4):
                    flags = _QR | rcode | (_RD if bits & 2 else 0)
                    flags |= _CD if bits & 1 else 0
                    authority = 1 if kind >= 2 else 0
                    if authority:
                        flags |= _AA
                    self._heads[(kind << 3) | (edns << 2) | bits] = struct.pack(
                        "!HHHHH", flags, 1, 0, authority, edns
                    )
        # Our OPT: payload 1232, version 0, the query's DO bit.
        self._opt = (
            b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x00",
            b"\x00\x00\x29\x04\xd0\x00\x00\x80\x00\x00\x00",
        )

    def _soa(self, apexAt: int, data: bytes) -> bytes:
        """The SOA RR compressed as dnspython does after the question."""
        at = apexAt - 11
        if (
            at >= 12
            and data[at:apexAt].lower() == _HOSTMASTER
            and self._labelStart(data, at)
        ):
            # The question ends in hostmaster.<apex>: the rname points there.
            return self._soaFor(apexAt, struct.pack("!H", 0xC000 | at))
        soa = self._soaAt.get(apexAt)
        if soa is None:
            soa = self._soaAt[apexAt] = self._soaFor(apexAt, None)
        return soa

    def _soaFor(self, apexAt: int, rname: bytes | None) -> bytes:
        pointer = struct.pack("!H", 0xC000 | apexAt)
        if rname is None:
            rname = _HOSTMASTER + pointer
        rdata = pointer + rname + self._soaTail
        return pointer + self._soaHead + struct.pack("!H", len(rdata)) + rdata

    def answer(self, data: bytes, udp: bool) -> Reply | None:
        """The reply to C{data}, or C{None} when the general path must decide."""
        n = len(data)
        if n < 12 or data[2] & 0xF8 or data[4] or data[5] != 1:
            return None  # silence, other opcodes, QDCOUNT: already cheap there
        # Walk the question name label by label.
        i = 12
        try:
            length = data[12]
            while length:
                if length > 63:
                    if length >= 0xC0:
                        return None  # a compression pointer: dnspython follows it
                    return self._formerr(data)  # reserved label type
                i += length + 1
                length = data[i]
        except IndexError:
            return self._formerr(data)  # the name runs past the end
        nameEnd = i + 1
        qEnd = nameEnd + 4
        if nameEnd > 267 or qEnd > n:
            return self._formerr(data)  # name over 255 bytes, or cut short
        remaining = n - qEnd
        if data[6:11] != b"\x00\x00\x00\x00\x00":
            return self._records(data, remaining)
        edns = data[11]
        if not edns:
            if remaining:
                return self._formerr(data)  # trailing junk
        elif edns != 1 or remaining < 11:
            return self._records(data, remaining)
        elif (
            data[qEnd : qEnd + 3] != b"\x00\x00\x29"
            or data[qEnd + 9 : qEnd + 11] != b"\x00\x00"
        ):
            return None  # not an OPT, or one with options
        elif remaining > 11:
            return self._formerr(data)  # trailing junk after the OPT
        elif data[qEnd + 6]:
            return None  # EDNS version: BADVERS is the general path's
        qtype = (data[nameEnd] << 8) | data[nameEnd + 1]
        apexAt = nameEnd - self._apexLength
        if (
            data[nameEnd + 2]
            or data[nameEnd + 3] != 1
            or qtype == _AXFR
            or qtype == _IXFR
            or apexAt < 12
            or data[nameEnd - self._lastLabel] != self._lastLength
            or data[apexAt:nameEnd].lower() != self._apex
            or not self._labelStart(data, apexAt)
        ):
            text, kind = "REFUSED", 0
        elif qtype in _METATYPES:
            text, kind = "NOTIMP", 1
        elif apexAt != 12:
            text, kind = "NXDOMAIN", 2
        elif qtype in self._apexAnswers:
            return None
        else:
            text, kind = "NOERROR", 3
        head = self._heads[
            (kind << 3) | (edns << 2) | ((data[2] & 1) << 1) | ((data[3] >> 4) & 1)
        ]
        reply = data[:2] + head + (data[12:] if n == qEnd else data[12:qEnd])
        if kind >= 2:
            reply += self._soa(apexAt, data)
        if edns:
            reply += self._opt[data[qEnd + 7] >> 7]
            payload = (data[qEnd + 3] << 8) | data[qEnd + 4]
            limit = (
                min(max(payload, self._minimumUdp), _MAX_PAYLOAD) if udp else _TCP_LIMIT
            )
        else:
            limit = self._minimumUdp if udp else _TCP_LIMIT
        if len(reply) > limit:
            return None  # the general path truncates
        return _new(Reply, (reply, _LABELS.get(qtype, OTHER_QTYPE), text, False))

    @staticmethod
    def _labelStart(data: bytes, at: int) -> bool:
        """Whether a label of the question name starts at C{at}."""
        i = 12
        while i < at:
            i += data[i] + 1
        return i == at

    def _records(self, data: bytes, remaining: int) -> Reply | None:
        """FORMERR when the records counted cannot fit; else undecided."""
        records = (data[6] << 8) + data[7] + (data[8] << 8) + data[9]
        records += (data[10] << 8) + data[11]
        if remaining < 11 * records:
            return self._formerr(data)  # every record takes 11 bytes or more
        return None

    @staticmethod
    def _formerr(data: bytes) -> Reply:
        return Reply(headerOnly(data, 1), NO_QTYPE, "FORMERR", True)
