"""Tests for L{fleetd.dns.responder}: every answer kind, EDNS, the fast path."""

from __future__ import annotations

import struct

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import dns.tsigkeyring
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from fleetd.dns.responder import Responder, headerOnly, qtypeLabel
from tests.dnssupport import NAME, TOPOLOGY, TOPOLOGY6, query


def parse(wire: bytes | None) -> dns.message.Message:
    assert wire is not None
    return dns.message.from_wire(wire)


class AnswerTests(SynchronousTestCase):
    """The general path's answer for each kind of question [A5]."""

    def setUp(self) -> None:
        self.responder = Responder(TOPOLOGY, 60, serial=7)

    def answer(self, data: bytes, udp: bool = True) -> dns.message.Message:
        return parse(self.responder.respond(data, udp=udp).wire)

    def test_a_apex(self) -> None:
        """A at the enrollment name is SPORE_BOOTSTRAP_IP, authoritative [A5] [A1]."""
        reply = self.responder.respond(query(), udp=True)
        self.assertEqual(
            (reply.qtype, reply.rcode, reply.malformed), ("A", "NOERROR", False)
        )
        response = parse(reply.wire)
        self.assertEqual(response.id, 0x1234)
        self.assertEqual(response.rcode(), dns.rcode.NOERROR)
        self.assertTrue(response.flags & dns.flags.AA)
        self.assertTrue(response.flags & dns.flags.QR)
        self.assertTrue(response.flags & dns.flags.RD)
        self.assertFalse(response.flags & (dns.flags.RA | dns.flags.AD | dns.flags.TC))
        [rrset] = response.answer
        self.assertEqual([r.to_text() for r in rrset], ["10.20.0.6"])
        self.assertEqual(rrset.ttl, 60)
        self.assertEqual((response.authority, response.additional), ([], []))

    def test_ttlConfigurable(self) -> None:
        """The TTL of answers is the configured one [A5]."""
        response = parse(Responder(TOPOLOGY, 5).respond(query(), udp=True).wire)
        self.assertEqual(response.answer[0].ttl, 5)

    def test_caseInsensitive(self) -> None:
        """Names match regardless of case; the question's 0x20 case is echoed [A5]."""
        data = query("EnRoLL.LolWTF.cA")
        wire = self.responder.respond(data, udp=True).wire
        assert wire is not None
        self.assertIn(b"\x06EnRoLL\x06LolWTF\x02cA\x00", wire)
        response = parse(wire)
        self.assertEqual(response.answer[0][0].to_text(), "10.20.0.6")
        self.assertEqual(response.question[0].name.to_text(), "EnRoLL.LolWTF.cA.")

    def test_aaaaWithAddress(self) -> None:
        """AAAA is SPORE_BOOTSTRAP_IPV6 when the topology has one [A5]."""
        response = parse(
            Responder(TOPOLOGY6, 60).respond(query(rdtype="AAAA"), udp=True).wire
        )
        self.assertEqual(response.answer[0][0].to_text(), "2001:db8::6")
        self.assertTrue(response.flags & dns.flags.AA)

    def test_aaaaNoData(self) -> None:
        """Without an IPv6 address, AAAA is NOERROR with no data and the SOA [A5]."""
        response = self.answer(query(rdtype="AAAA"))
        self.assertEqual(response.rcode(), dns.rcode.NOERROR)
        self.assertEqual(response.answer, [])
        [soa] = response.authority
        self.assertEqual(soa.rdtype, dns.rdatatype.SOA)
        self.assertEqual(soa[0].serial, 7)
        self.assertEqual(soa[0].minimum, 60)
        self.assertTrue(response.flags & dns.flags.AA)

    def test_soa(self) -> None:
        """SOA at the apex answers with the zone's SOA [A5]."""
        response = self.answer(query(rdtype="SOA"))
        [rrset] = response.answer
        self.assertEqual(rrset.name, dns.name.from_text(NAME))
        self.assertEqual(rrset[0].mname, dns.name.from_text(NAME))
        self.assertEqual(rrset[0].rname, dns.name.from_text(f"hostmaster.{NAME}"))

    def test_ns(self) -> None:
        """NS at the apex names the apex itself, its addresses in additional [A5]."""
        response = parse(
            Responder(TOPOLOGY6, 60).respond(query(rdtype="NS"), udp=True).wire
        )
        self.assertEqual(response.answer[0][0].target, dns.name.from_text(NAME))
        self.assertEqual(
            sorted(dns.rdatatype.to_text(r.rdtype) for r in response.additional),
            ["A", "AAAA"],
        )

    def test_anyMinimal(self) -> None:
        """ANY gets the A RRset alone (RFC 8482) [A5]."""
        response = self.answer(query(rdtype="ANY"))
        [rrset] = response.answer
        self.assertEqual(rrset.rdtype, dns.rdatatype.A)

    def test_otherTypeNoData(self) -> None:
        """Other types at the apex are NODATA with the SOA [A5]."""
        for rdtype in ("MX", "TXT", "CNAME", "HTTPS", 65000):
            response = self.answer(query(rdtype=rdtype))
            self.assertEqual(response.rcode(), dns.rcode.NOERROR, rdtype)
            self.assertEqual(response.answer, [])
            self.assertEqual(response.authority[0].rdtype, dns.rdatatype.SOA)

    def test_subdomainNXDomain(self) -> None:
        """Names below the apex are NXDOMAIN, authoritative, with the SOA [A5]."""
        reply = self.responder.respond(query(f"x.y.{NAME}"), udp=True)
        self.assertEqual(reply.rcode, "NXDOMAIN")
        response = parse(reply.wire)
        self.assertTrue(response.flags & dns.flags.AA)
        self.assertEqual(response.authority[0].rdtype, dns.rdatatype.SOA)

    def test_outsideRefused(self) -> None:
        """Names outside the zone are REFUSED, not authoritative [A5]."""
        for name in ("example.com", "lolwtf.ca", f"x{NAME}", "."):
            reply = self.responder.respond(query(name), udp=True)
            self.assertEqual(reply.rcode, "REFUSED", name)
            response = parse(reply.wire)
            self.assertFalse(response.flags & dns.flags.AA)
            self.assertEqual(response.answer + response.authority, [])
            self.assertEqual(response.question[0].name, dns.name.from_text(name))

    def test_classRefused(self) -> None:
        """Classes other than IN are REFUSED [A5]."""
        for rdclass in ("CH", "HS", "ANY"):
            response = self.answer(query(rdclass=rdclass))
            self.assertEqual(response.rcode(), dns.rcode.REFUSED, rdclass)

    def test_zoneTransferRefused(self) -> None:
        """AXFR and IXFR are REFUSED [A5]."""
        for rdtype in ("AXFR", "IXFR"):
            self.assertEqual(
                self.answer(query(rdtype=rdtype)).rcode(), dns.rcode.REFUSED
            )

    def test_metaTypeNotImp(self) -> None:
        """Meta-types other than ANY as QTYPE are NOTIMP [A5]."""
        for rdtype in ("MAILA", "MAILB", "TSIG"):
            self.assertEqual(
                self.answer(query(rdtype=rdtype)).rcode(), dns.rcode.NOTIMP
            )

    def test_opcodeNotImp(self) -> None:
        """Opcodes other than QUERY get NOTIMP with the ID and opcode echoed [A5]."""
        for opcode in (dns.opcode.NOTIFY, dns.opcode.UPDATE, dns.opcode.STATUS, 7):
            data = bytearray(query())
            data[2] = (data[2] & 0x87) | (opcode << 3)
            reply = self.responder.respond(bytes(data), udp=True)
            self.assertEqual(reply.rcode, "NOTIMP")
            response = parse(reply.wire)
            self.assertEqual((response.id, response.opcode()), (0x1234, opcode))
            self.assertEqual(response.rcode(), dns.rcode.NOTIMP)

    def test_questionCountFormErr(self) -> None:
        """QDCOUNT other than one is FORMERR, ID echoed [A5]."""
        for count in (0, 2):
            data = bytearray(query())
            data[4:6] = struct.pack("!H", count)
            reply = self.responder.respond(bytes(data), udp=True)
            self.assertEqual((reply.rcode, reply.malformed), ("FORMERR", True))
            self.assertEqual(parse(reply.wire).id, 0x1234)

    def test_responseIgnored(self) -> None:
        """A message with QR set gets no reply at all: no reflection loops [A5]."""
        data = query(flags=dns.flags.QR | dns.flags.AA)
        reply = self.responder.respond(data, udp=True)
        self.assertIsNone(reply.wire)
        self.assertTrue(reply.malformed)
        self.assertIsNone(self.responder.fast(data))

    def test_shortSilent(self) -> None:
        """Fewer than 12 bytes get no reply [A5]."""
        for n in range(12):
            self.assertIsNone(self.responder.respond(query()[:n], udp=True).wire)

    def test_flagsCopied(self) -> None:
        """RD and CD are copied; RA, AD and Z never set [A5]."""
        flags = dns.flags.CD | dns.flags.AD | 0x0040
        response = self.answer(query(flags=flags))
        self.assertEqual(response.flags & ~dns.flags.AA, dns.flags.QR | dns.flags.CD)

    def test_tsigNotAuth(self) -> None:
        """A signed query is NOTAUTH: we hold no keys [A5]."""
        message = dns.message.make_query(NAME, "A")
        keyring = dns.tsigkeyring.from_text({"k.": "c2VjcmV0c2VjcmV0c2VjcmV0"})
        message.use_tsig(keyring, "k.")
        self.assertEqual(self.answer(message.to_wire()).rcode(), dns.rcode.NOTAUTH)

    def test_qtypeLabel(self) -> None:
        """Metric labels for QTYPE are bounded: rare types are 'other' [A5]."""
        self.assertEqual(qtypeLabel(dns.rdatatype.A), "A")
        self.assertEqual(qtypeLabel(dns.rdatatype.RdataType.make(65000)), "other")

    def test_headerOnly(self) -> None:
        """Header-only replies copy ID, opcode, RD and CD and set QR [A5]."""
        wire = headerOnly(b"\xab\xcd\x29\x10" + bytes(8), dns.rcode.FORMERR)
        self.assertEqual(wire, b"\xab\xcd\xa9\x11" + bytes(8))


class EDNSTests(SynchronousTestCase):
    """EDNS0 handling and truncation [A5]."""

    def setUp(self) -> None:
        self.responder = Responder(TOPOLOGY, 60)

    def test_optEchoed(self) -> None:
        """An OPT in the query gets an OPT with payload 1232 and DO copied [A5]."""
        for ednsflags in (0, dns.flags.DO):
            data = query(edns=0, payload=4096, ednsflags=ednsflags)
            response = parse(self.responder.respond(data, udp=True).wire)
            self.assertEqual((response.edns, response.payload), (0, 1232))
            self.assertEqual(response.ednsflags, ednsflags)

    def test_noOptWithoutEdns(self) -> None:
        """A query without OPT gets a reply without OPT [A5]."""
        self.assertEqual(parse(self.responder.respond(query(), udp=True).wire).edns, -1)

    def test_badVersion(self) -> None:
        """EDNS version above 0 gets BADVERS with an OPT of version 0 [A5]."""
        reply = self.responder.respond(query(edns=1), udp=True)
        self.assertEqual(reply.rcode, "BADVERS")
        response = parse(reply.wire)
        self.assertEqual((response.rcode(), response.edns), (dns.rcode.BADVERS, 0))

    def test_optionsIgnored(self) -> None:
        """Unknown EDNS options (cookies, NSID) do not change the answer [A5]."""
        message = dns.message.make_query(NAME, "A", use_edns=0)
        message.use_edns(
            0, options=[dns.edns.GenericOption(dns.edns.OptionType.COOKIE, b"\x01" * 8)]
        )
        response = parse(self.responder.respond(message.to_wire(), udp=True).wire)
        self.assertEqual(response.answer[0][0].to_text(), "10.20.0.6")
        self.assertEqual(response.options, ())

    def test_truncated(self) -> None:
        """A UDP reply over the client's limit is cut to the question, TC set [A5]."""
        small = Responder(TOPOLOGY6, 60, minimumUdpPayload=60)
        data = query(rdtype="NS", edns=0, payload=60)
        wire = small.respond(data, udp=True).wire
        assert wire is not None
        self.assertLessEqual(len(wire), 60)
        response = parse(wire)
        self.assertTrue(response.flags & dns.flags.TC)
        self.assertEqual(response.answer + response.additional, [])
        self.assertEqual((response.edns, len(response.question)), (0, 1))

    def test_tcpNotTruncated(self) -> None:
        """Over TCP the same reply is whole [A5]."""
        small = Responder(TOPOLOGY6, 60, minimumUdpPayload=60)
        data = query(rdtype="NS", edns=0, payload=60)
        response = parse(small.respond(data, udp=False).wire)
        self.assertFalse(response.flags & dns.flags.TC)
        self.assertEqual(len(response.additional), 2)

    def test_smallPayloadIsAtLeast512(self) -> None:
        """A client payload under 512 counts as 512 (RFC 6891) [A5]."""
        data = query(rdtype="NS", edns=0, payload=100)
        response = parse(Responder(TOPOLOGY6, 60).respond(data, udp=True).wire)
        self.assertFalse(response.flags & dns.flags.TC)


def _fastQuery(
    qid: int,
    case: list[bool],
    header: int,
    opt: tuple[int, int, int] | None,
) -> bytes:
    """An A query for NAME with the given ID, letter case, flag bits and OPT."""
    letters = iter(case)
    labels = b""
    for label in NAME.split("."):
        text = "".join(c.upper() if next(letters) else c for c in label)
        labels += bytes([len(text)]) + text.encode()
    flags = header & 0x07FF  # opcode QUERY, QR clear; any other bit
    counts = (1, 0, 0, 0 if opt is None else 1)
    data = struct.pack("!HH4H", qid, flags, *counts) + labels + b"\x00\x00\x01\x00\x01"
    if opt is not None:
        payload, extRcode, ednsFlags = opt
        data += b"\x00\x00\x29" + struct.pack(
            "!HBBHH", payload, extRcode, 0, ednsFlags, 0
        )
    return data


class FastPathTests(SynchronousTestCase):
    """The pre-encoded A reply is byte-identical to the general path [A5]."""

    def setUp(self) -> None:
        self.responder = Responder(TOPOLOGY, 60)

    @settings(max_examples=400, deadline=None)
    @given(
        qid=st.integers(0, 0xFFFF),
        case=st.lists(st.booleans(), min_size=14, max_size=14),
        header=st.integers(0, 0xFFFF),
        opt=st.none()
        | st.tuples(
            st.integers(0, 0xFFFF), st.integers(0, 255), st.integers(0, 0xFFFF)
        ),
        udp=st.booleans(),
    )
    def test_sameAsGeneral(
        self,
        qid: int,
        case: list[bool],
        header: int,
        opt: tuple[int, int, int] | None,
        udp: bool,
    ) -> None:
        """For any ID, case, flags and OPT, fast == general path [A5]."""
        data = _fastQuery(qid, case, header, opt)
        fast = self.responder.fast(data)
        self.assertIsNotNone(fast)
        self.assertEqual(fast, self.responder.respond(data, udp=udp).wire)

    @settings(max_examples=400, deadline=None)
    @given(
        position=st.integers(0, 60),
        value=st.integers(0, 255),
        opt=st.booleans(),
    )
    def test_mutatedNeverDiffers(self, position: int, value: int, opt: bool) -> None:
        """A mutated query is declined by the fast path or answered alike [A5]."""
        data = bytearray(
            _fastQuery(7, [False] * 14, 0x0100, (1232, 0, 0) if opt else None)
        )
        if position < len(data):
            data[position] = value
        fast = self.responder.fast(bytes(data))
        if fast is not None:
            self.assertEqual(fast, self.responder.respond(bytes(data), udp=True).wire)

    def test_declines(self) -> None:
        """Other names, types, classes, options, versions: general path [A5]."""
        for data in (
            query("x.enroll.lolwtf.ca"),
            query("enroll.lolwtf.cb"),
            query(rdtype="AAAA"),
            query(rdclass="CH"),
            query(edns=1),
            query(flags=dns.flags.QR),
            query() + b"\x00",
        ):
            self.assertIsNone(self.responder.fast(data), data)
        message = dns.message.make_query(NAME, "A", use_edns=0)
        message.use_edns(
            0, options=[dns.edns.GenericOption(dns.edns.OptionType.COOKIE, b"\x01" * 8)]
        )
        self.assertIsNone(self.responder.fast(message.to_wire()))

    def test_disabledWhenTooBig(self) -> None:
        """With a limit too small for the A reply, the fast path steps aside [A5]."""
        small = Responder(TOPOLOGY, 60, minimumUdpPayload=40)
        self.assertIsNone(small.fast(query()))
        self.assertTrue(
            parse(small.respond(query(), udp=True).wire).flags & dns.flags.TC
        )
