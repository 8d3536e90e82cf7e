"""
What the DNS responder's general and cheap paths share: the reply record,
header-only replies and the bounded metric labels.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

import dns.rdatatype

HEADER: Final = 12

_QR: Final = 0x8000
_CD: Final = 0x0010

# Bounded label values for fleetd_dns_queries_total.
QTYPE_LABELS: Final = frozenset(
    "A AAAA ANY NS SOA CNAME MX TXT PTR SRV HTTPS SVCB CAA DS DNSKEY AXFR IXFR".split()
)
NO_QTYPE: Final = "none"
OTHER_QTYPE: Final = "other"


class Reply(NamedTuple):
    """What the responder decided for one packet."""

    wire: bytes | None
    """The encoded response, or C{None} for silence."""
    qtype: str
    """A bounded metric label for the question's type."""
    rcode: str
    """The response code as text (C{"none"} when silent)."""
    malformed: bool
    """The packet was not a well-formed query."""


def qtypeLabel(rdtype: dns.rdatatype.RdataType) -> str:
    """The metric label for C{rdtype}: its mnemonic if common, else C{other}."""
    text = dns.rdatatype.to_text(rdtype)
    return text if text in QTYPE_LABELS else OTHER_QTYPE


def headerOnly(data: bytes, rcode: int) -> bytes:
    """
    A response with no sections to the query whose header starts C{data}.

    The ID, opcode, RD and CD are copied; QR and C{rcode} are set.
    """
    flags = _QR | ((data[2] << 8) & 0x7900) | (data[3] & _CD) | (rcode & 0xF)
    return data[:2] + struct.pack("!HHHHH", flags, 0, 0, 0, 0)
