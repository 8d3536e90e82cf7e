"""
Tests for L{fleetd.listen.policy}: which client CA each listener trusts and
how large a body it takes, pinned ([O1] [O2] [T4] [A3]).
"""

from __future__ import annotations

from pathlib import Path

from OpenSSL import SSL
from twisted.trial.unittest import SynchronousTestCase

from fleetd.config import Settings, loadSettings
from fleetd.listen.policy import ListenerPolicy, listenerPolicy
from fleetd.pki.dev import ensureDevPKI
from tests.support import writeConfig


def settingsIn(directory: Path) -> Settings:
    """The test config, with the dev PKI its paths name."""
    ensureDevPKI(directory / "pki", "enroll.lolwtf.ca")
    return loadSettings(writeConfig(directory, {"limits": {"max_body_bytes": 1000}}))


class ListenerPolicyTests(SynchronousTestCase):
    """Each listener's policy, as the daemon applies it."""

    def setUp(self) -> None:
        self.settings = settingsIn(Path(self.mktemp()))

    def test_boot_noClientCertificate(self) -> None:
        """Boot asks for no client certificate; bodies up to
        limits.max_body_bytes from anyone (nodes have no certificate yet)."""
        self.assertEqual(
            listenerPolicy(self.settings, "boot"), ListenerPolicy("boot", 1000)
        )

    def test_device_trustBundle(self) -> None:
        """Device asks for certificates from the LDevID trust bundle, never
        the owner CA; bodies up to limits.max_body_bytes [T4] [A3]."""
        self.assertEqual(
            listenerPolicy(self.settings, "device"),
            ListenerPolicy(
                "device",
                1000,
                clientCA=self.settings.pki.bundle,
                clientCAKey="pki.bundle",
            ),
        )

    def test_admin_ownerCA(self) -> None:
        """Admin asks for certificates from the owner CA only; large bodies
        (limits.admin_max_body_bytes) from owners only [O1] [O2]."""
        self.assertEqual(
            listenerPolicy(self.settings, "admin"),
            ListenerPolicy(
                "admin",
                self.settings.limits.admin_max_body_bytes,
                clientCA=self.settings.owner.client_ca,
                clientCAKey="owner.client_ca",
                largeBodiesForOwnersOnly=True,
            ),
        )

    def test_tink_h2Only(self) -> None:
        """Tink offers h2 only and asks for no client certificate; the proxy
        bounds its own streams."""
        self.assertEqual(
            listenerPolicy(self.settings, "tink"),
            ListenerPolicy("tink", None, alpn=(b"h2",)),
        )

    def test_unknown_refused(self) -> None:
        """A name that is no listener has no policy."""
        self.assertRaises(ValueError, listenerPolicy, self.settings, "dns")

    def test_tlsOptions_askOnlyWhereTrusted(self) -> None:
        """The TLS layer asks for (never requires) a client certificate on
        device and admin only [A3]."""
        modes = {}
        for name in ("boot", "device", "admin", "tink"):
            policy = listenerPolicy(self.settings, name)
            context = policy.tlsOptions(self.settings.tls).getContext()
            mode = context.get_verify_mode()
            asks = bool(mode & SSL.VERIFY_PEER)
            modes[name] = (asks, bool(mode & SSL.VERIFY_FAIL_IF_NO_PEER_CERT))
        self.assertEqual(
            modes,
            {
                "boot": (False, False),
                "device": (True, False),
                "admin": (True, False),
                "tink": (False, False),
            },
        )
