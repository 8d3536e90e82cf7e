"""
The DNS fallback responder's decisions: one query's bytes in, a reply out [A5].

No I/O here. L{Responder} is authoritative for one zone whose apex is the
topology's enrollment name, and answers:

  - C{A} at the apex with SPORE_BOOTSTRAP_IP; C{AAAA} with
    SPORE_BOOTSTRAP_IPV6 when the topology has one, else NOERROR/NODATA;
  - C{SOA} and C{NS} at the apex (the name server is the apex itself, its
    address in the additional section), so answers are well-formed;
  - C{ANY} minimally (RFC 8482): the C{A} RRset alone;
  - other types at the apex: NODATA; names below the apex: NXDOMAIN, both
    with the SOA in the authority section for negative caching;
  - names outside the zone, classes other than IN, zone transfers: REFUSED;
  - opcodes other than QUERY, meta-types as QTYPE: NOTIMP;
  - QDCOUNT other than 1 and anything dnspython cannot parse: FORMERR with
    the query's ID and an empty body; signed (TSIG) queries: NOTAUTH;
  - fewer than 12 bytes, or a message with QR set: no reply at all, so two
    responders can never be made to talk to each other.

NOERROR and NXDOMAIN carry AA; refusals and errors do not. RD and CD are
copied, AD and RA are never set. EDNS0 (RFC 6891): an OPT in the query gets
an OPT with our payload size (1232) and the query's DO bit; version > 0 gets
BADVERS. UDP replies fit the client's limit (its EDNS payload, at least 512,
at most 1232), else they are cut to header, question and OPT with TC set.

The general path parses with dnspython. L{Responder.fast} answers the one
query that matters under load (A at the apex, class IN, no EDNS options)
from bytes pre-encoded by the general path itself, so both are identical
by construction; a property test checks it. L{Responder.respond} first
tries L{fleetd.dns.quick.QuickAnswers}, which derives refusals, NXDOMAIN,
NODATA and FORMERR from the query's own bytes, so a flood of other names
costs no dnspython parse; property tests check it against the general path.
"""

from __future__ import annotations

from typing import Final

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from fleetd.config import Topology
from fleetd.dns.quick import QuickAnswers
from fleetd.dns.wire import (
    HEADER,
    NO_QTYPE,
    OTHER_QTYPE,
    QTYPE_LABELS,
    Reply,
    headerOnly,
    qtypeLabel,
)

__all__ = [
    "HEADER",
    "NO_QTYPE",
    "OTHER_QTYPE",
    "QTYPE_LABELS",
    "Reply",
    "Responder",
    "headerOnly",
    "qtypeLabel",
]

OUR_UDP_PAYLOAD: Final = 1232
MINIMUM_UDP_PAYLOAD: Final = 512
TCP_PAYLOAD: Final = 65535

_QR: Final = 0x8000
_AA: Final = 0x0400
_TC: Final = 0x0200
_RD: Final = 0x0100
_CD: Final = 0x0010
_DO: Final = 0x8000


_RCODE_TEXT: Final[dict[dns.rcode.Rcode, str]] = {
    dns.rcode.NOERROR: "NOERROR",
    dns.rcode.FORMERR: "FORMERR",
    dns.rcode.NXDOMAIN: "NXDOMAIN",
    dns.rcode.NOTIMP: "NOTIMP",
    dns.rcode.REFUSED: "REFUSED",
    dns.rcode.NOTAUTH: "NOTAUTH",
    dns.rcode.BADVERS: "BADVERS",
}


class Responder:
    """
    Answers for one topology, pre-encoded at construction.

    @param ttl: the TTL of every record and of negative answers.
    @param serial: the SOA serial; callers use the load time so that a
        reload changes it.
    @param minimumUdpPayload: the floor for a client's UDP limit (512 per
        RFC 6891); only tests lower it, to exercise truncation.
    """

    def __init__(
        self,
        topology: Topology,
        ttl: int,
        *,
        serial: int = 1,
        minimumUdpPayload: int = MINIMUM_UDP_PAYLOAD,
    ) -> None:
        self.topology = topology
        self.ttl = ttl
        self._minimumUdp = minimumUdpPayload
        apex = dns.name.from_text(topology.enrollment_name)
        self.apex = apex

        def rrset(rdtype: str, *values: str) -> dns.rrset.RRset:
            return dns.rrset.from_text(apex, ttl, "IN", rdtype, *values)

        self._a = rrset("A", topology.spore_bootstrap_ip)
        v6 = topology.spore_bootstrap_ipv6
        self._aaaa = None if v6 is None else rrset("AAAA", v6)
        self._soa = rrset(
            "SOA",
            f"{apex} hostmaster.{apex} {serial % 2**32} 3600 600 86400 {ttl}",
        )
        self._ns = rrset("NS", str(apex))
        self._glue = [self._a] if self._aaaa is None else [self._a, self._aaaa]
        apexAnswers = {dns.rdatatype.A, dns.rdatatype.ANY}
        apexAnswers |= {dns.rdatatype.SOA, dns.rdatatype.NS}
        if self._aaaa is not None:
            apexAnswers.add(dns.rdatatype.AAAA)
        soa = self._soa[0]
        self.quick = QuickAnswers(
            apex,
            ttl,
            (soa.serial, soa.refresh, soa.retry, soa.expire, soa.minimum),
            frozenset(int(t) for t in apexAnswers),
            minimumUdpPayload,
        ).answer
        self._preEncode()

    def respond(self, data: bytes, *, udp: bool) -> Reply:
        """
        Decide the reply to C{data}, received over UDP if C{udp}: from the
        query's bytes when L{QuickAnswers} can, else by the general path.
        """
        reply = self.quick(data, udp)
        if reply is not None:
            return reply
        return self.general(data, udp=udp)

    # -- general path -----------------------------------------------------

    def general(self, data: bytes, *, udp: bool) -> Reply:
        """Decide the reply to C{data} by parsing it with dnspython."""
        if len(data) < HEADER or data[2] & 0x80:
            return Reply(None, NO_QTYPE, NO_QTYPE, True)
        if (data[2] >> 3) & 0xF != dns.opcode.QUERY:
            return Reply(headerOnly(data, dns.rcode.NOTIMP), NO_QTYPE, "NOTIMP", False)
        if data[4:6] != b"\x00\x01":
            return self._formerr(data)
        try:
            query = dns.message.from_wire(data)
        except dns.message.UnknownTSIGKey:
            reply = headerOnly(data, dns.rcode.NOTAUTH)
            return Reply(reply, NO_QTYPE, "NOTAUTH", False)
        except Exception:  # any parse failure is the sender's problem
            return self._formerr(data)
        question = query.question[0]
        response = dns.message.Message(id=query.id)
        response.flags = _QR | (query.flags & (_RD | _CD))
        response.question = [question]
        if query.edns >= 0:
            response.use_edns(0, query.ednsflags & _DO, OUR_UDP_PAYLOAD)
        rcode = self._decide(query, question, response)
        response.set_rcode(rcode)
        if udp:
            payload = query.payload if query.edns >= 0 else 0
            limit = min(max(payload, self._minimumUdp), OUR_UDP_PAYLOAD)
        else:
            limit = TCP_PAYLOAD
        return Reply(
            self._render(response, limit),
            qtypeLabel(question.rdtype),
            _RCODE_TEXT.get(rcode, str(rcode)),
            False,
        )

    def _formerr(self, data: bytes) -> Reply:
        return Reply(headerOnly(data, dns.rcode.FORMERR), NO_QTYPE, "FORMERR", True)

    def _decide(
        self,
        query: dns.message.Message,
        question: dns.rrset.RRset,
        response: dns.message.Message,
    ) -> dns.rcode.Rcode:
        """Fill C{response}'s sections and return its rcode."""
        if query.edns > 0:
            return dns.rcode.BADVERS
        if question.rdclass != dns.rdataclass.IN:
            return dns.rcode.REFUSED
        qtype = question.rdtype
        if qtype in (dns.rdatatype.AXFR, dns.rdatatype.IXFR):
            return dns.rcode.REFUSED
        name = question.name
        if not name.is_subdomain(self.apex):
            return dns.rcode.REFUSED
        if qtype != dns.rdatatype.ANY and dns.rdatatype.is_metatype(qtype):
            return dns.rcode.NOTIMP
        response.flags |= _AA
        if name != self.apex:
            response.authority.append(self._soa)
            return dns.rcode.NXDOMAIN
        if qtype in (dns.rdatatype.A, dns.rdatatype.ANY):
            response.answer.append(self._a)
        elif qtype == dns.rdatatype.AAAA and self._aaaa is not None:
            response.answer.append(self._aaaa)
        elif qtype == dns.rdatatype.SOA:
            response.answer.append(self._soa)
        elif qtype == dns.rdatatype.NS:
            response.answer.append(self._ns)
            response.additional.extend(self._glue)
        else:
            response.authority.append(self._soa)
        return dns.rcode.NOERROR

    @staticmethod
    def _render(response: dns.message.Message, limit: int) -> bytes:
        """Encode C{response} in C{limit} bytes, truncating with TC if needed."""
        try:
            wire = response.to_wire(max_size=limit)
        except dns.exception.TooBig:
            pass
        else:
            # dnspython never renders under 512 bytes; lower test limits too.
            if len(wire) <= limit:
                return wire
        response.answer = []
        response.authority = []
        response.additional = []
        response.flags |= _TC
        return response.to_wire(max_size=limit)

    # -- fast path --------------------------------------------------------

    def _preEncode(self) -> None:
        """Encode the apex A reply once through the general path."""
        question = self.apex.to_wire()
        assert question is not None
        question += b"\x00\x01\x00\x01"
        self._qEnd = HEADER + len(question)
        plain = b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00" + question
        edns = plain[:11] + b"\x01" + plain[12:] + b"\x00\x00\x29\x02\x00" + bytes(6)
        self._plainLength = len(plain)
        self._ednsLength = len(edns)
        self._plainTail = plain[4:]
        self._ednsTail = edns[4 : self._qEnd]
        self._plainHead: dict[int, bytes] = {}
        self._ednsHead: dict[int, bytes] = {}
        self._ednsAnswer: list[bytes] = []
        for bits in (0x00, 0x01, 0x10, 0x11):
            flags = bytes([bits & 0x01, bits & 0x10])
            reply = self.general(plain[:2] + flags + plain[4:], udp=True).wire
            assert reply is not None
            self._plainHead[bits] = reply[2:HEADER]
            self._plainAnswer = reply[self._qEnd :]
            reply = self.general(edns[:2] + flags + edns[4:], udp=True).wire
            assert reply is not None
            self._ednsHead[bits] = reply[2:HEADER]
        for do in (0x00, 0x80):
            query = edns[:-4] + bytes([do]) + edns[-3:]
            reply = self.general(query, udp=True).wire
            assert reply is not None
            self._ednsAnswer.append(reply[self._qEnd :])
        if len(self._ednsAnswer[0]) + self._qEnd > self._minimumUdp:
            self._plainLength = self._ednsLength = -1

    def fast(self, data: bytes) -> bytes | None:
        """
        The reply to an A query for the apex, or C{None} for anything else.

        When it returns bytes, they equal C{respond(data, ...).wire}.
        """
        n = len(data)
        if n == self._plainLength:
            if data[2] & 0xF8 or data[4:].lower() != self._plainTail:
                return None
            return (
                data[:2]
                + self._plainHead[(data[2] & 0x01) | (data[3] & 0x10)]
                + data[HEADER:]
                + self._plainAnswer
            )
        if n == self._ednsLength:
            q = self._qEnd
            if (
                data[2] & 0xF8
                or data[4:q].lower() != self._ednsTail
                or data[q : q + 3] != b"\x00\x00\x29"
                or data[q + 6]
                or data[q + 9 :] != b"\x00\x00"
            ):
                return None
            return (
                data[:2]
                + self._ednsHead[(data[2] & 0x01) | (data[3] & 0x10)]
                + data[HEADER:q]
                + self._ednsAnswer[data[q + 7] >> 7]
            )
        return None
