"""The DNS tests' site, query builder, TCP framing and UDP collector."""

from __future__ import annotations

import struct
from typing import Any

import dns.message
import dns.rdatatype
from prometheus_client import CollectorRegistry
from twisted.internet.protocol import DatagramProtocol
from twisted.python.threadpool import ThreadPool
from twisted.trial.unittest import TestCase

from fleetd.config import Anchor, Topology

NAME = "enroll.lolwtf.ca"
TOPOLOGY = Topology(
    spore_ip="10.20.0.5",
    spore_bootstrap_ip="10.20.0.6",
    enrollment_name=NAME,
    anchors=(Anchor("anchor-a", "127.0.0.2"), Anchor("anchor-b", "127.0.0.3")),
)
TOPOLOGY6 = Topology("10.20.0.5", "10.20.0.6", NAME, TOPOLOGY.anchors, "2001:db8::6")


def query(
    name: str = NAME,
    rdtype: str | int = "A",
    *,
    rdclass: str = "IN",
    edns: int = -1,
    payload: int = 1232,
    ednsflags: int = 0,
    flags: int | None = None,
    qid: int = 0x1234,
) -> bytes:
    """The wire form of a query built with dnspython."""
    message = dns.message.make_query(
        name,
        dns.rdatatype.RdataType.make(rdtype),
        rdclass,
        use_edns=edns,
        payload=payload,
        ednsflags=ednsflags,
    )
    message.id = qid
    if flags is not None:
        message.flags = flags
    return message.to_wire()


class Collector(DatagramProtocol):
    def __init__(self) -> None:
        self.got: list[tuple[bytes, Any]] = []

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        if datagram == b"boom":
            raise ValueError("handler bug")
        self.got.append((datagram, addr))


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def framed(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def unframe(stream: bytes) -> list[bytes]:
    messages = []
    while stream:
        (n,) = struct.unpack("!H", stream[:2])
        messages.append(stream[2 : 2 + n])
        stream = stream[2 + n :]
    return messages


def threadPool(testCase: TestCase) -> ThreadPool:
    """A thread pool for blocking clients, stopped at the end of the test."""
    pool = ThreadPool(1, 1, name=testCase.id())
    pool.start()
    testCase.addCleanup(pool.stop)
    return pool
