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
_DO: Final = 0x80  # in the high byte of the OPT's flags
_OUR_PAYLOAD: Final = 1232
_MAX_PAYLOAD: Final = 1232
_TCP_LIMIT: Final = 65535

_LABELS: Final[dict[int, str]] = {
    int(dns.rdatatype.from_text(t)): t for t in QTYPE_LABELS
}
_A: Final = 1
_NS: Final = 2
_SOA: Final = 6
_AAAA: Final = 28
_IXFR: Final = 251
_AXFR: Final = 252
_ANY: Final = 255
_HOSTMASTER: Final = b"\x0ahostmaster"

_FORMERR: Final = ("FORMERR", 1)
_NXDOMAIN: Final = ("NXDOMAIN", 3)
_NOTIMP: Final = ("NOTIMP", 4)
_REFUSED: Final = ("REFUSED", 5)
_NOERROR: Final = ("NOERROR", 0)


def _label(qtype: int) -> str:
    return _LABELS.get(qtype, OTHER_QTYPE)


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
        self._apexAnswers = apexAnswers
        self._minimumUdp = minimumUdpPayload
        self._soaHead = struct.pack("!HHIH", _SOA, 1, ttl, 0)[:-2]
        self._soaTail = struct.pack("!5I", *soaFields)

    def _soa(self, apexAt: int, data: bytes) -> bytes:
        """The SOA RR compressed as dnspython does after the question."""
        pointer = struct.pack("!H", 0xC000 | apexAt)
        at = apexAt - 11
        if at >= 12 and data[at:apexAt].lower() == _HOSTMASTER:
            # The question ends in hostmaster.<apex>: the rname points there.
            rname = struct.pack("!H", 0xC000 | at)
        else:
            rname = _HOSTMASTER + pointer
        rdata = pointer + rname + self._soaTail
        return pointer + self._soaHead + struct.pack("!H", len(rdata)) + rdata

    def answer(self, data: bytes, udp: bool) -> Reply | None:
        """The reply to C{data}, or C{None} when the general path must decide."""
        n = len(data)
        if n < 12 or data[2] & 0xF8 or data[4:6] != b"\x00\x01":
            return None  # silence, other opcodes, QDCOUNT: already cheap there
        # The question name, label by label; remember where each one starts.
        i = 12
        starts = []
        while True:
            if i >= n:
                return self._formerr(data)
            length = data[i]
            if length == 0:
                break
            if length > 63:
                if length >= 0xC0:
                    return None  # a compression pointer: dnspython follows it
                return self._formerr(data)  # reserved label type
            starts.append(i)
            i += length + 1
        nameEnd = i + 1
        if nameEnd - 12 > 255:
            return self._formerr(data)
        qEnd = nameEnd + 4
        if qEnd > n:
            return self._formerr(data)
        remaining = n - qEnd
        records = (data[6] << 8) + data[7] + (data[8] << 8) + data[9]
        records += (data[10] << 8) + data[11]
        if remaining < 11 * records:
            return self._formerr(data)  # every record takes 11 bytes or more
        edns = False
        if records == 0:
            if remaining:
                return self._formerr(data)  # trailing junk
        elif records == 1 and data[11] == 1:
            if (
                data[qEnd : qEnd + 3] != b"\x00\x00\x29"
                or data[qEnd + 9 : qEnd + 11] != b"\x00\x00"
            ):
                return None  # not an OPT, or one with options
            if remaining > 11:
                return self._formerr(data)  # trailing junk after the OPT
            if data[qEnd + 6]:
                return None  # EDNS version: BADVERS is the general path's
            edns = True
        else:
            return None
        qtype, qclass = struct.unpack_from("!HH", data, nameEnd)
        apexAt = nameEnd - self._apexLength
        inZone = (
            apexAt >= 12
            and (apexAt == 12 or apexAt in starts)
            and data[apexAt:nameEnd].lower() == self._apex
        )
        authority = b""
        if qclass != 1 or qtype in (_AXFR, _IXFR) or not inZone:
            text, rcode = _REFUSED
        elif qtype != _ANY and dns.rdatatype.is_metatype(
            dns.rdatatype.RdataType(qtype)
        ):
            text, rcode = _NOTIMP
        elif apexAt != 12:
            text, rcode = _NXDOMAIN
            authority = self._soa(apexAt, data)
        elif qtype in self._apexAnswers:
            return None
        else:
            text, rcode = _NOERROR
            authority = self._soa(apexAt, data)
        flags = _QR | (((data[2] << 8) | data[3]) & (_RD | _CD)) | rcode
        if authority:
            flags |= _AA
        header = data[:2] + struct.pack(
            "!HHHHH", flags, 1, 0, 1 if authority else 0, 1 if edns else 0
        )
        reply = header + data[12:qEnd] + authority
        if edns:
            reply += b"\x00\x00\x29\x04\xd0\x00\x00" + bytes(
                [data[qEnd + 7] & _DO, 0, 0, 0]
            )
            payload = (data[qEnd + 3] << 8) | data[qEnd + 4]
        else:
            payload = 0
        if udp:
            limit = min(max(payload, self._minimumUdp), _MAX_PAYLOAD)
        else:
            limit = _TCP_LIMIT
        if len(reply) > limit:
            return None  # the general path truncates
        return Reply(reply, _label(qtype), text, False)

    @staticmethod
    def _formerr(data: bytes) -> Reply:
        return Reply(headerOnly(data, 1), NO_QTYPE, "FORMERR", True)
