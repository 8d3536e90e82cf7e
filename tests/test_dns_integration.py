"""
DNSService on real loopback sockets, asked by dig (bind9-dnsutils) and by
dnspython [A5].
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from typing import cast

import dns.flags
import dns.message
import dns.query
import dns.rcode
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.interfaces import IReactorFromThreads, IReactorUDP
from twisted.internet.threads import deferToThreadPool
from twisted.internet.utils import getProcessOutputAndValue
from twisted.python.threadpool import ThreadPool
from twisted.trial.unittest import SkipTest, TestCase

from fleetd.dns.service import DNSService, portNumber
from tests.test_dns_responder import NAME, TOPOLOGY


def startService(
    testCase: TestCase, interface: str = "127.0.0.1", **topology: object
) -> DNSService:
    """A DNSService on C{interface}, port 0, stopped at the end of the test."""
    service = DNSService(
        cast(IReactorUDP, reactor),
        TOPOLOGY,
        port=0,
        interface=interface,
        ttl=60,
        registry=CollectorRegistry(),
        topologyLoader=lambda: TOPOLOGY,
    )
    service.startService()
    testCase.addCleanup(service.stopService)
    return service


def threadPool(testCase: TestCase) -> ThreadPool:
    """A thread pool for blocking clients, stopped at the end of the test."""
    pool = ThreadPool(1, 1, name=testCase.id())
    pool.start()
    testCase.addCleanup(pool.stop)
    return pool


class DigTests(TestCase):
    """fleetd answers dig over UDP and TCP [A5]."""

    def setUp(self) -> None:
        self.digPath = shutil.which("dig")
        if self.digPath is None:
            raise SkipTest("dig not installed (Debian package bind9-dnsutils)")
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
        for _ in range(20):  # find a port free for both (other tests run too)
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.bind(("127.0.0.1", 0))
            port = udp.getsockname()[1]
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                tcp.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
            finally:
                udp.close()
                tcp.close()
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
