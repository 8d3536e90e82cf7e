"""
DNSService on real loopback sockets, asked by dig (bind9-dnsutils) and by
dnspython [A5].
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from typing import Any, cast

import dns.flags
import dns.message
import dns.query
import dns.rcode
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.interfaces import IReactorFromThreads, IReactorUDP
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThreadPool
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase

from fleetd.config import DNSRateLimit
from fleetd.dns.service import UDP_READ_BYTES, DNSService, portNumber
from tests.dnssupport import NAME, TOPOLOGY, query, threadPool
from tests.support import missingPeer


def startService(
    testCase: TestCase,
    interface: str = "127.0.0.1",
    port: int = 0,
    **options: Any,
) -> DNSService:
    """A DNSService on C{interface}, C{port}, stopped at the end of the test."""
    service = DNSService(
        cast(IReactorUDP, reactor),
        TOPOLOGY,
        port=port,
        interface=interface,
        ttl=60,
        registry=CollectorRegistry(),
        topologyLoader=lambda: TOPOLOGY,
        **options,
    )
    service.startService()
    testCase.addCleanup(service.stopService)
    return service


def freePort() -> int:
    """A port free on 127.0.0.1 for both UDP and TCP (other tests run too)."""
    while True:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        port: int = udp.getsockname()[1]
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            tcp.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            udp.close()
            tcp.close()


class DigTests(TestCase):
    """fleetd answers dig over UDP and TCP [A5]."""

    def setUp(self) -> None:
        self.digPath = shutil.which("dig")
        if self.digPath is None:
            raise missingPeer("dig not installed (Debian package bind9-dnsutils)")
        self.service = startService(self)

    async def query(self, *args: str) -> str:
        assert self.digPath is not None and self.service.udpPort is not None
        assert self.service.tcpPort is not None
        tcp = "+tcp" in args
        port = portNumber(self.service.tcpPort if tcp else self.service.udpPort)
        argv = ["@127.0.0.1", "-p", str(port), "+norec", "+time=5", "+tries=1"]
        out, err, code = await getProcessOutputAndValue(
            self.digPath,
            [*argv, *args],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            reactor=reactor,
        )
        self.assertEqual(code, 0, err)
        return cast(bytes, out).decode()

    async def test_udp(self) -> None:
        """dig over UDP gets the A record, flag aa, NOERROR [A5] [A1]."""
        record = rf"(?m)^{re.escape(NAME)}\.\s+60\s+IN\s+A\s+10\.20\.0\.6$"
        for extra in ((), ("+noedns",), ("+nocookie", "+dnssec")):
            out = await self.query(NAME, "A", *extra)
            self.assertIn("status: NOERROR", out)
            self.assertRegex(out, r"flags: qr aa;")
            self.assertRegex(out, record)

    async def test_tcp(self) -> None:
        """dig over TCP gets the same answer [A5]."""
        out = await self.query(NAME, "A", "+tcp")
        self.assertIn("status: NOERROR", out)
        self.assertRegex(out, r"flags: qr aa;")
        self.assertIn("10.20.0.6", out)

    async def test_refused(self) -> None:
        """Another name is REFUSED over UDP and TCP [A5]."""
        for extra in ((), ("+tcp",)):
            out = await self.query("example.com", "A", *extra)
            self.assertIn("status: REFUSED", out)

    async def test_caseAndAAAA(self) -> None:
        """Mixed case is answered; AAAA without an address is NODATA [A5]."""
        out = await self.query(NAME.upper(), "A")
        self.assertIn("ENROLL.LOLWTF.CA.", out)
        self.assertIn("10.20.0.6", out)
        out = await self.query(NAME, "AAAA")
        self.assertIn("status: NOERROR", out)
        self.assertIn("ANSWER: 0", out)
        self.assertIn("SOA", out)


class DNSPythonTests(TestCase):
    """fleetd answers dnspython's client over UDP and TCP [A5]."""

    async def test_udpAndTcp(self) -> None:
        """dnspython gets an authoritative A answer both ways [A5] [A1]."""
        service = startService(self)
        assert service.udpPort is not None and service.tcpPort is not None
        udpPort, tcpPort = portNumber(service.udpPort), portNumber(service.tcpPort)
        pool = threadPool(self)

        def ask() -> list[dns.message.Message]:
            q = dns.message.make_query(NAME, "A", use_edns=0)
            return [
                dns.query.udp(q, "127.0.0.1", timeout=2, port=udpPort),
                dns.query.tcp(q, "127.0.0.1", timeout=2, port=tcpPort),
            ]

        responses = await deferToThreadPool(
            cast(IReactorFromThreads, reactor), pool, ask
        )
        for response in responses:
            self.assertEqual(response.rcode(), dns.rcode.NOERROR)
            self.assertTrue(response.flags & dns.flags.AA)
            self.assertEqual(response.answer[0][0].to_text(), "10.20.0.6")
            self.assertEqual(response.payload, 1232)

    async def test_samePort(self) -> None:
        """A configured port serves both UDP and TCP [A5]."""
        port = freePort()
        service = DNSService(
            cast(IReactorUDP, reactor),
            TOPOLOGY,
            port=port,
            interface="127.0.0.1",
            ttl=60,
            registry=CollectorRegistry(),
            topologyLoader=lambda: TOPOLOGY,
        )
        service.startService()
        self.addCleanup(service.stopService)
        assert service.udpPort is not None and service.tcpPort is not None
        self.assertEqual(portNumber(service.udpPort), port)
        self.assertEqual(portNumber(service.tcpPort), port)


class LimitsOnLoopbackTests(TestCase):
    """
    The per-source TCP cap and response-rate limiting on real sockets, with
    sources 127.0.0.2 and 127.0.0.3 (issue 8, items 8 and 12).
    """

    async def inThread(self, f: Any) -> Any:
        return await deferToThreadPool(
            cast(IReactorFromThreads, reactor), threadPool(self), f
        )

    async def test_tcpPerSource(self) -> None:
        """
        One source holding its share of TCP slots cannot take more; another
        source is still answered over TCP (issue 8, item 8; design.md, Listeners).
        """
        service = startService(self, maxConnectionsPerSource=4)
        assert service.tcpPort is not None
        port = portNumber(service.tcpPort)

        def connect(source: str) -> socket.socket:
            s = socket.create_connection(
                ("127.0.0.1", port), timeout=5, source_address=(source, 0)
            )
            self.addCleanup(s.close)
            return s

        def flood() -> bytes:
            held = [connect("127.0.0.2") for _ in range(4)]
            extra = connect("127.0.0.2")
            try:
                closed = extra.recv(1)  # the server closes it at once
            except ConnectionResetError:
                closed = b""
            # The source that holds slots keeps them; another one is served.
            message = dns.message.make_query(NAME, "A")
            response = dns.query.tcp(
                message, "127.0.0.1", timeout=5, port=port, source="127.0.0.3"
            )
            assert len(held) == 4 and closed == b"", closed
            return response.to_wire()

        wire = await self.inThread(flood)
        response = dns.message.from_wire(wire)
        self.assertEqual(response.answer[0][0].to_text(), "10.20.0.6")

    async def test_rrlSlipsToTCP(self) -> None:
        """
        A source over its budget gets a truncated reply and dig falls back
        to TCP and gets the answer; another source is answered over UDP at
        once. The limiter's clock is a frozen L{Clock} (issue 8, item 12).
        """
        digPath = shutil.which("dig")
        assert digPath is not None, "dig (bind9-dnsutils) is part of the test setup"
        settings = DNSRateLimit(rate=1, burst=3, slip=1, ipv4_prefix=32)
        port = freePort()
        startService(self, port=port, rateLimit=settings, clock=Clock())

        def flood() -> list[bool]:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.addCleanup(s.close)
            s.bind(("127.0.0.2", 0))
            s.settimeout(5)
            truncated = []
            for i in range(10):
                s.sendto(query(qid=i), ("127.0.0.1", port))
                reply = dns.message.from_wire(s.recv(512))
                truncated.append(bool(reply.flags & dns.flags.TC))
            return truncated

        self.assertEqual(await self.inThread(flood), [False] * 3 + [True] * 7)

        async def dig(source: str) -> str:
            argv = ["@127.0.0.1", "-p", str(port), "-b", source, "+norec"]
            out, err, code = await getProcessOutputAndValue(
                digPath,
                [*argv, "+time=5", "+tries=1", "+noedns", NAME, "A"],
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                reactor=reactor,
            )
            self.assertEqual(code, 0, err)
            return cast(bytes, out).decode()

        out = await dig("127.0.0.2")
        self.assertIn("Truncated, retrying in TCP mode", out)
        self.assertIn("10.20.0.6", out)
        out = await dig("127.0.0.3")
        self.assertNotIn("Truncated", out)
        self.assertIn("10.20.0.6", out)

    def test_udpReadBounded(self) -> None:
        """
        One reactor turn reads at most UDP_READ_BYTES of datagrams, so a DNS
        flood cannot hold the reactor for thousands of queries while the
        boot listener waits (issue 8, item 12).
        """
        registry = CollectorRegistry()
        service = DNSService(
            cast(IReactorUDP, reactor),
            TOPOLOGY,
            port=0,
            interface="127.0.0.1",
            ttl=60,
            registry=registry,
            topologyLoader=lambda: TOPOLOGY,
            rateLimit=DNSRateLimit(enabled=False),
        )
        service.startService()
        self.addCleanup(service.stopService)
        assert service.udpPort is not None
        port = portNumber(service.udpPort)
        packet = query("flood.example.com")
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.addCleanup(sender.close)
        for _ in range(200):
            sender.sendto(packet, ("127.0.0.1", port))
        service.udpPort.doRead()  # type: ignore[attr-defined]
        labels = {"qtype": "A", "rcode": "REFUSED", "transport": "udp"}
        read = registry.get_sample_value("fleetd_dns_queries_total", labels)
        self.assertEqual(read, -(-UDP_READ_BYTES // len(packet)))
