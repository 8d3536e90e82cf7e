"""
SIGHUP's part for the listeners: the public certificate and key read
again, so a renewed certificate (an ACME client rewrote the files) is
served without a restart. All listeners or none: a file that does not
load leaves every listener on the certificate it had.
"""

from __future__ import annotations

from typing import cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from fleetd.config import Settings
from fleetd.listen.policy import ListenerName, listenerPolicy
from fleetd.listen.service import Listeners


def reloadCertificates(listeners: Listeners, settings: Settings) -> dict[str, str]:
    """
    Load C{tls.cert}, C{tls.key} and C{tls.chain} again for every TLS
    listener (with the same checks as at start: the key matches the
    certificate) and use them for new connections. Open connections keep
    theirs.

    @return: what to log and journal: the listeners, the new leaf's
        SHA-256 fingerprint and its notAfter.
    @raise fleetd.config.ConfigError: a file does not load; nothing was changed.
    """
    tls = settings.tls
    names = listeners.reloadTLS(
        lambda name: listenerPolicy(settings, cast(ListenerName, name)).tlsOptions(tls)
    )
    loaded = listeners.tls[names[0]].options.certificate
    assert loaded is not None  # loadTLSOptions always sets one
    leaf: x509.Certificate = loaded.to_cryptography()
    return {
        "listeners": ",".join(names),
        "sha256": leaf.fingerprint(hashes.SHA256()).hex(),
        "not_after": leaf.not_valid_after_utc.isoformat(),
    }
