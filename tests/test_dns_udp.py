"""L{fleetd.dns.udp.QuickPort}: the DNS responder's UDP read loop [A5]."""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import reactor
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.dns.udp import QuickPort, listenUDP
from tests.dnssupport import Collector


class QuickPortTests(SynchronousTestCase):
    def listen(self, interface: str, family: int) -> tuple[Collector, Any, Any]:
        proto = Collector()
        port = listenUDP(reactor, 0, proto, interface=interface, batched=False)
        self.addCleanup(port.stopListening)
        self.assertIsInstance(port, QuickPort)
        sender = socket.socket(family, socket.SOCK_DGRAM)
        self.addCleanup(sender.close)
        sender.bind((interface, 0))
        return proto, port, sender

    def test_readsWithinBudget_handlerFailureLogged_turnGoesOn(self) -> None:
        """
        One turn reads datagrams until C{maxThroughput} bytes are read; a
        handler's exception is logged and the next datagram still arrives;
        an empty socket ends the turn quietly.
        """
        proto, port, sender = self.listen("127.0.0.1", socket.AF_INET)
        port.maxThroughput = 25
        target = ("127.0.0.1", port.getHost().port)
        for payload in (b"one-", b"boom", b"two-", b"3333333333", b"four", b"five"):
            sender.sendto(payload, target)
        with capturedLogs() as events:
            port.doRead()
        self.assertEqual(
            [d for d, _ in proto.got], [b"one-", b"two-", b"3333333333", b"four"]
        )
        self.assertEqual(proto.got[0][1], sender.getsockname())
        failures = [e for e in events if "log_failure" in e]
        self.assertEqual(len(failures), 1)
        self.assertIsInstance(failures[0]["log_failure"].value, ValueError)
        self.flushLoggedErrors(ValueError)
        port.doRead()  # "five", then EAGAIN: returns
        port.doRead()  # nothing at all: returns
        self.assertEqual(proto.got[-1][0], b"five")

    def test_ipv6_addressIsHostAndPort(self) -> None:
        """Over IPv6 the handler gets (host, port), as from Twisted's port."""
        if not socket.has_ipv6:
            raise self.skipTest("no IPv6")
        try:
            proto, port, sender = self.listen("::1", socket.AF_INET6)
        except Exception as e:  # no ::1 here
            raise self.skipTest(f"no ::1: {e}") from e
        sender.sendto(b"six", ("::1", port.getHost().port))
        port.doRead()
        self.assertEqual(proto.got, [(b"six", sender.getsockname()[:2])])

    def test_testDoubles_getTheirOwnListenUDP(self) -> None:
        """A reactor that is not a real one is asked through C{listenUDP}."""
        calls: list[tuple[Any, ...]] = []

        class Fake:
            def listenUDP(self, *args: Any, **kwargs: Any) -> str:
                calls.append((args, kwargs))
                return "listening"

        proto = Collector()
        self.assertEqual(listenUDP(Fake(), 53, proto, interface="::1"), "listening")
        self.assertEqual(
            calls, [((53, proto), {"interface": "::1", "maxPacketSize": 8192})]
        )
