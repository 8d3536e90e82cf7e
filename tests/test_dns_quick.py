"""
Tests for L{fleetd.dns.quick}: refusals, NXDOMAIN, NODATA and FORMERR
derived from the query's own bytes equal the general (dnspython) path's
replies (issue 8, item 12; [A5]).
"""

from __future__ import annotations

import struct

import dns.edns
import dns.flags
import dns.message
import dns.rcode
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from fleetd.dns.responder import Responder
from tests.dnssupport import NAME, TOPOLOGY, TOPOLOGY6, query

RESPONDERS = {
    "v4": Responder(TOPOLOGY, 60, serial=1764700000),
    "v6": Responder(TOPOLOGY6, 5, serial=7),
    "small": Responder(TOPOLOGY, 60, minimumUdpPayload=60),
}

_APEX = [label.encode() for label in NAME.split(".")]

# Type codes worth covering: the apex's own records, the refused and
# meta-types, OPT as a QTYPE, zero, and whatever hypothesis picks.
QTYPES = st.sampled_from(
    [1, 2, 5, 6, 15, 16, 28, 41, 65, 249, 250, 251, 252, 253, 254, 255, 0, 65535]
) | st.integers(0, 0xFFFF)
QCLASSES = st.sampled_from([1, 1, 1, 3, 4, 254, 255, 0]) | st.integers(0, 0xFFFF)
LABEL = st.binary(min_size=1, max_size=63) | st.sampled_from(
    [b"x", b"hostmaster", b"HostMaster", b"www", b"enroll", b"lolwtf", b"ca"]
)


@st.composite
def names(draw: st.DrawFn) -> list[bytes]:
    """Labels of a name inside, at, or outside the zone, in any case."""
    kind = draw(st.sampled_from(["apex", "below", "outside", "suffix", "long"]))
    case = draw(st.lists(st.booleans(), min_size=len(NAME), max_size=len(NAME)))
    apex = []
    position = 0
    for label in _APEX:
        chars = bytes(
            c - 32 if case[position + k] and 97 <= c <= 122 else c
            for k, c in enumerate(label)
        )
        position += len(label) + 1
        apex.append(chars)
    if kind == "apex":
        return apex
    if kind == "below":
        return draw(st.lists(LABEL, min_size=1, max_size=4)) + apex
    if kind == "suffix":  # a label ends like the apex starts: not in the zone
        return [b"x" + apex[0], *apex[1:]]
    if kind == "long":
        return [b"a" * 63] * draw(st.integers(3, 5)) + apex
    return draw(st.lists(LABEL, min_size=0, max_size=4))


def wireName(labels: list[bytes]) -> bytes:
    return b"".join(bytes([len(label)]) + label for label in labels) + b"\x00"


@st.composite
def queries(draw: st.DrawFn) -> tuple[bytes, bool]:
    """
    A query of one question and at most an OPT, and whether it is well
    formed (no cut, no junk, EDNS version 0).
    """
    qid = draw(st.integers(0, 0xFFFF))
    flags = draw(st.integers(0, 0xFFFF)) & 0x07FF  # QR clear, opcode QUERY
    labels = draw(names())
    qtype = draw(QTYPES)
    qclass = draw(QCLASSES)
    opt = draw(
        st.none()
        | st.tuples(
            st.integers(0, 0xFFFF),
            st.integers(0, 255),
            st.sampled_from([0, 0, 0, 1, 255]),
            st.integers(0, 0xFFFF),
        )
    )
    counts = (1, 0, 0, 0 if opt is None else 1)
    data = struct.pack("!HH4H", qid, flags, *counts) + wireName(labels)
    data += struct.pack("!HH", qtype, qclass)
    wellFormed = True
    if opt is not None:
        payload, extRcode, version, ednsFlags = opt
        data += b"\x00\x00\x29" + struct.pack(
            "!HBBHH", payload, extRcode, version, ednsFlags, 0
        )
        wellFormed = version == 0
    tail = draw(st.sampled_from(["none", "none", "junk", "cut"]))
    if tail == "junk":
        data += draw(st.binary(min_size=1, max_size=12))
        wellFormed = False
    elif tail == "cut":
        data = data[: draw(st.integers(12, len(data) - 1))]
        wellFormed = False
    return data, wellFormed


class QuickPathTests(SynchronousTestCase):
    """The cheap path answers as the general path does (issue 8, item 12)."""

    def compare(self, responder: Responder, data: bytes, udp: bool) -> bool:
        """Assert the two paths agree when the cheap one answers; say whether it did."""
        quick = responder.quick(data, udp)
        if quick is None:
            return False
        self.assertEqual(quick, responder.general(data, udp=udp), data)
        return True

    @settings(max_examples=1500, deadline=None)
    @given(
        made=queries(),
        which=st.sampled_from(sorted(RESPONDERS)),
        udp=st.booleans(),
    )
    def test_sameAsGeneral(
        self, made: tuple[bytes, bool], which: str, udp: bool
    ) -> None:
        """
        For any ID, flags, name, case, type, class, OPT, junk or cut, the
        cheap reply equals the general path's (bytes, labels, rcode); and
        it does answer every well-formed refusal, NXDOMAIN, NODATA and
        FORMERR that fits (issue 8, item 12; [A5]).
        """
        data, wellFormed = made
        responder = RESPONDERS[which]
        answered = self.compare(responder, data, udp)
        general = responder.general(data, udp=udp)
        assert general.wire is not None
        fits = not dns.message.from_wire(general.wire).flags & dns.flags.TC
        if general.rcode == "FORMERR" or (
            wellFormed and fits and general.rcode in ("REFUSED", "NXDOMAIN", "NOTIMP")
        ):
            self.assertTrue(answered, (data, general))
        elif wellFormed and fits and general.rcode == "NOERROR":
            response = dns.message.from_wire(general.wire)
            if not response.answer:  # NODATA
                self.assertTrue(answered, (data, general))

    @settings(max_examples=1000, deadline=None)
    @given(
        edits=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 255)), max_size=4),
        name=st.sampled_from(["example.com", f"x.{NAME}", NAME]),
        rdtype=st.sampled_from(["A", "MX", "AAAA", "TXT"]),
        edns=st.booleans(),
    )
    def test_mutatedNeverDiffers(
        self, edits: list[tuple[int, int]], name: str, rdtype: str, edns: bool
    ) -> None:
        """Bytes changed anywhere: declined, or answered like the general path [A5]."""
        data = bytearray(query(name, rdtype, edns=0 if edns else -1))
        for position, value in edits:
            if position < len(data):
                data[position] = value
        for responder in RESPONDERS.values():
            self.compare(responder, bytes(data), True)
            self.compare(responder, bytes(data), False)

    def test_kinds(self) -> None:
        """Each kind is answered by the cheap path with its rcode (issue 8, item 12)."""
        responder = RESPONDERS["v4"]
        header = struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 0)
        cases = [
            (query("example.com"), "REFUSED"),
            (query("example.com", edns=0), "REFUSED"),
            (query(NAME, rdclass="CH"), "REFUSED"),
            (query(NAME, "AXFR"), "REFUSED"),
            (query(f"x.{NAME}"), "NXDOMAIN"),
            (query(f"hostmaster.{NAME}", edns=0, ednsflags=0x8000), "NXDOMAIN"),
            # A label that ends in the bytes of "\x0ahostmaster": no pointer to it.
            (header + b"\x0dab\x0ahostmaster" + query()[12:], "NXDOMAIN"),
            (query(NAME, "MX"), "NOERROR"),
            (query(NAME, "AAAA", edns=0), "NOERROR"),
            (query(NAME, "MAILA"), "NOTIMP"),
            (header + b"\x3fabc", "FORMERR"),
            (header + b"\x40abc\x00\x00\x01\x00\x01", "FORMERR"),
            (query() + b"\x00", "FORMERR"),
            (query()[:-1], "FORMERR"),
        ]
        for data, rcode in cases:
            reply = responder.quick(data, True)
            assert reply is not None, data
            self.assertEqual(reply.rcode, rcode, data)
            self.assertEqual(reply, responder.general(data, udp=True))
            response = dns.message.from_wire(reply.wire or b"")
            self.assertEqual(response.id, struct.unpack("!H", data[:2])[0])
            self.assertEqual(dns.rcode.to_text(response.rcode()), rcode)

    def test_declines(self) -> None:
        """Pointers, options, apex records, BADVERS go to the general path [A5]."""
        responder = RESPONDERS["v4"]
        header = struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0)
        message = dns.message.make_query("example.com", "A", use_edns=0)
        message.use_edns(
            0, options=[dns.edns.GenericOption(dns.edns.OptionType.COOKIE, b"\x01" * 8)]
        )
        for data in (
            query(),
            query(NAME, "SOA"),
            query(NAME, "NS"),
            query(NAME, "ANY"),
            query("example.com", edns=1),
            message.to_wire(),
            header + b"\xc0\x04\x00\x01\x00\x01",
            query(flags=dns.flags.QR),
            query()[:11],
        ):
            self.assertIsNone(responder.quick(data, True), data)
        self.assertIsNone(RESPONDERS["v6"].quick(query(NAME, "AAAA"), True))

    def test_truncationLeftToGeneral(self) -> None:
        """A reply over the UDP limit is left to the general path to cut [A5]."""
        small = RESPONDERS["small"]
        data = query(f"{'a' * 40}.{NAME}", "A")
        self.assertIsNone(small.quick(data, True))
        self.assertIsNotNone(small.quick(data, False))
        response = dns.message.from_wire(small.respond(data, udp=True).wire or b"")
        self.assertTrue(response.flags & dns.flags.TC)
