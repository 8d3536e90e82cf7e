"""
fleetd's TLS self-check of its own listeners (issue 27, item 2;
design.md, Listeners): one handshake with ALPN against a real loopback
TLS listener built as fleetd builds its own (L{checkListener}), and the
rounds of L{SelfCheck} on an injected clock.
"""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from OpenSSL import SSL, crypto
from twisted.internet import reactor
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.config import TLSFiles
from fleetd.listen.selfcheck import (
    INTERVAL,
    RETRY,
    SelfCheck,
    SelfCheckFailed,
    Target,
    checkListener,
    loopback,
)
from fleetd.listen.tls import ServerConnections, loadTLSOptions, tlsFactory
from fleetd.pki.dev import ensureDevPKI
from fleetd.reactors import fleetdReactor

REACTOR = fleetdReactor(reactor)


class BrokenConnections(ServerConnections):
    """A listener whose TLS cannot start, as under PR_SET_MDWE (cffi's
    MemoryError while the context installs its ALPN callback)."""

    def serverConnectionForTLS(self, protocol: Any) -> SSL.Connection:
        raise MemoryError("Cannot allocate write+execute memory for ffi.callback()")


class Silent(Protocol):
    """Accepts TCP, never speaks."""


class CheckListenerTests(TestCase):
    """One self-check against a real loopback TLS listener."""

    timeout = 30

    def setUp(self) -> None:
        pki = ensureDevPKI(Path(self.mktemp()), "enroll.lolwtf.ca")
        self.files = TLSFiles(pki.public_cert, pki.public_key, pki.public_ca)
        leaf = crypto.load_certificate(
            crypto.FILETYPE_PEM, pki.public_cert.read_bytes()
        )
        self.der = crypto.dump_certificate(crypto.FILETYPE_ASN1, leaf)

    def listen(self, alpn: list[bytes] | None, broken: bool = False) -> IPv4Address:
        options = loadTLSOptions(self.files, alpn=alpn)
        kind = BrokenConnections if broken else ServerConnections
        factory = tlsFactory(
            kind(options),
            Factory.forProtocol(Protocol),
            name="test",
            clock=reactor,
            maxConnections=8,
            idleTimeout=30,
        )
        port = REACTOR.listenTCP(0, factory, interface="127.0.0.1")  # type: ignore[arg-type]
        self.addCleanup(factory.closeAll)
        self.addCleanup(port.stopListening)
        address = port.getHost()
        assert isinstance(address, IPv4Address)
        return address

    def check(
        self, address: Any, protocol: bytes, certificate: bytes | None = None
    ) -> Deferred[None]:
        target = Target(address, protocol, certificate or self.der)
        return Deferred.fromCoroutine(checkListener(REACTOR, target, timeout=5))

    async def failure(self, check: Deferred[None]) -> str:
        try:
            await check
        except SelfCheckFailed as e:
            return str(e)
        raise AssertionError("the self-check passed")

    def test_h2Listener_passes(self) -> Deferred[None]:
        """A listener choosing h2 by ALPN (tink's) passes a check offering h2."""
        return self.check(self.listen([b"h2"]), b"h2")

    def test_httpListener_passes(self) -> Deferred[None]:
        """An HTTP listener (ALPN from its site: http/1.1) passes."""
        return self.check(self.listen([b"http/1.1"]), b"http/1.1")

    async def test_brokenTLS_failsNamingTheHandshake(self) -> None:
        """
        A listener whose TLS cannot start (the PR_SET_MDWE failure: the
        server drops the connection) fails with a one-line reason.
        """
        reason = await self.failure(self.check(self.listen(None, True), b"h2"))
        self.assertEqual(reason, "the connection closed during the TLS handshake")
        # The listener's own errors: its TLS never started.
        self.flushLoggedErrors(MemoryError, AttributeError)

    async def test_alpnNotChosen_fails(self) -> None:
        """A listener that does not speak the offered protocol fails."""
        reason = await self.failure(self.check(self.listen([b"http/1.1"]), b"h2"))
        self.assertTrue(reason.startswith("TLS error: "), reason)

    async def test_otherCertificate_fails(self) -> None:
        """A listener presenting another certificate than its own fails."""
        check = self.check(self.listen([b"h2"]), b"h2", certificate=b"other")
        reason = await self.failure(check)
        self.assertEqual(
            reason, "presented a certificate that is not its configured one"
        )

    async def test_silentListener_timesOut(self) -> None:
        """A listener that accepts and never answers fails once the time is up."""
        silent = Factory.forProtocol(Silent)
        port = REACTOR.listenTCP(0, silent, interface="127.0.0.1")  # type: ignore[arg-type]
        self.addCleanup(port.stopListening)
        target = Target(port.getHost(), b"h2", self.der)
        check = Deferred.fromCoroutine(checkListener(REACTOR, target, timeout=0.2))
        self.assertEqual(await self.failure(check), "no TLS handshake in time")

    async def test_notListening_fails(self) -> None:
        """A listener not bound (yet) fails without a connection."""
        self.assertEqual(await self.failure(self.check(None, b"h2")), "not listening")


class LoopbackTests(SynchronousTestCase):
    def test_wildcard_loopbackOfItsFamily(self) -> None:
        """A wildcard bind is checked on loopback of its family; others as bound."""
        self.assertEqual(loopback(IPv4Address("TCP", "0.0.0.0", 1)), "127.0.0.1")
        self.assertEqual(loopback(IPv6Address("TCP", "::", 1)), "::1")
        self.assertEqual(loopback(IPv4Address("TCP", "10.20.0.6", 1)), "10.20.0.6")
        self.assertEqual(loopback(IPv6Address("TCP", "fd00::6", 1)), "fd00::6")


class Checks:
    """A stand-in for checkListener: each call waits for the test's answer."""

    def __init__(self) -> None:
        self.pending: dict[str, Deferred[None]] = {}

    def __call__(
        self, reactor: Any, target: Target, timeout: float
    ) -> Coroutine[Any, Any, None]:
        d: Deferred[None] = Deferred()
        self.pending[target.protocol.decode()] = d

        async def wait() -> None:
            await d

        return wait()

    def answer(self, **outcomes: str | None) -> None:
        for name, reason in outcomes.items():
            d = self.pending.pop(name)
            d.callback(None) if reason is None else d.errback(SelfCheckFailed(reason))


class SelfCheckRoundTests(SynchronousTestCase):
    """Rounds: at once, every INTERVAL while all pass, every RETRY otherwise."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.checks = Checks()
        self.reports: list[tuple[str, str | None]] = []
        # the stand-in keys each check by its target's protocol: use names
        targets = {n: Target(None, n.encode(), b"") for n in ("boot", "tink")}
        self.service = SelfCheck(
            self.clock,  # type: ignore[arg-type]
            lambda: targets,
            lambda name, reason: self.reports.append((name, reason)),
            check=self.checks,
        )

    def test_passing_everyInterval(self) -> None:
        """The first round starts with the service; after a pass the next
        comes INTERVAL (60 s) later; each result is reported."""
        self.service.startService()
        self.checks.answer(boot=None, tink=None)
        self.assertEqual(self.reports, [("boot", None), ("tink", None)])
        self.clock.advance(INTERVAL - 1)
        self.assertEqual(self.checks.pending, {})
        self.clock.advance(1)
        self.assertEqual(set(self.checks.pending), {"boot", "tink"})

    def test_failing_retriedSooner_loggedOncePerChange(self) -> None:
        """After a failure the next round is RETRY (5 s) later; a failure
        is logged when it starts or changes, a recovery once."""
        self.service.startService()
        with capturedLogs() as events:
            self.checks.answer(boot=None, tink="TLS error: x")
            self.clock.advance(RETRY)
            self.checks.answer(boot=None, tink="TLS error: x")
            self.clock.advance(RETRY)
            self.checks.answer(boot=None, tink=None)
        self.assertEqual(self.reports[-1], ("tink", None))
        self.assertIn(("tink", "TLS error: x"), self.reports)
        names = [e["log_format"].split()[0] for e in events]
        self.assertEqual(names, ["selfcheck.failed", "selfcheck.passed"])

    def test_stop_cancelsTimerAndRound_reportsNothing(self) -> None:
        """Stopping cancels the next round's timer and the round in flight;
        nothing is reported after the stop (no delayed call is left)."""
        self.service.startService()
        self.service.stopService()
        self.assertEqual(self.reports, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.service.startService()
        self.checks.answer(boot=None, tink=None)
        self.service.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_checkNow_startsARound(self) -> None:
        """checkNow() (certificates reloaded) starts a round at once."""
        self.service.startService()
        self.checks.answer(boot=None, tink=None)
        self.service.checkNow()
        self.assertEqual(set(self.checks.pending), {"boot", "tink"})
        self.checks.answer(boot=None, tink=None)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
