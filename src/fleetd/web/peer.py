"""The client certificate TLS verified for a request, read from its transport."""

from __future__ import annotations

from typing import Any

from cryptography import x509


def peerCertificate(request: Any) -> x509.Certificate | None:
    """The client certificate TLS verified for C{request}, if it sent one."""
    transport = getattr(request, "transport", None)
    getPeer = getattr(transport, "getPeerCertificate", None)
    peer = None if getPeer is None else getPeer()
    if peer is None:
        return None
    cert: x509.Certificate = peer.to_cryptography()
    return cert
