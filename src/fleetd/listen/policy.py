"""
Listener policy: what each of fleetd's TLS listeners accepts.

One table says, per listener, which CA's client certificates the TLS layer
asks for, which protocols it offers (ALPN), and how large a request body
may be and whether only owners may send that much. The TLS options are
built from it (L{ListenerPolicy.tlsOptions}); C{tests/test_listen_policy.py}
pins it, so changing who is trusted where is a visible change.

  - C{boot}: no client certificate (nodes have none before their config);
    bodies up to C{limits.max_body_bytes}.
  - C{device}: the LDevID trust bundle (C{pki.bundle}), asked for but not
    required; the resources that need one check it [T4] [A3]. Bodies up to
    C{limits.max_body_bytes}.
  - C{admin}: the owner CA (C{owner.client_ca}), asked for but not
    required: C{/healthz} and C{/metrics} answer anyone, the owner gate
    decides per request [O1] [A3]. Bodies up to
    C{limits.admin_max_body_bytes}, from owners only; anyone else gets at
    most 64 KiB, decided at header time [O2].
  - C{tink}: HTTP/2 only, no client certificate; the proxy bounds its own
    streams and messages (C{[tink]}), so no body limit here.
  - C{kms} (with C{[kms]}): as C{tink}; Talos's KMS client checks the
    certificate and presents none, and the KMS bounds its own messages
    (C{kms.max_message_bytes}).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from twisted.internet import ssl

from fleetd.config import Settings, TLSFiles
from fleetd.listen.tls import loadTLSOptions

ListenerName = Literal["boot", "device", "admin", "tink", "kms"]


@dataclass(frozen=True)
class ListenerPolicy:
    """
    What one TLS listener accepts.

    @ivar maxBodyBytes: the largest request body an HTTP/1.1 listener
        accepts; L{None} for the tink proxy, which bounds its own streams.
    @ivar clientCA: the file of CAs whose client certificates the TLS layer
        asks for (never requires); L{None}: none asked for.
    @ivar clientCAKey: the configuration key naming C{clientCA}, for errors.
    @ivar alpn: the protocols offered by ALPN; L{None}: no ALPN.
    @ivar largeBodiesForOwnersOnly: only a peer with an owner certificate
        may send more than 64 KiB [O2].
    """

    name: ListenerName
    maxBodyBytes: int | None
    clientCA: Path | None = None
    clientCAKey: str = ""
    alpn: tuple[bytes, ...] | None = None
    largeBodiesForOwnersOnly: bool = False

    @property
    def clientProtocol(self) -> bytes:
        """What a client offers by ALPN and is given: the first of C{alpn},
        or HTTP/1.1 (what the HTTP listeners' sites choose)."""
        return b"http/1.1" if self.alpn is None else self.alpn[0]

    def tlsOptions(self, tls: TLSFiles) -> ssl.CertificateOptions:
        """The listener's server TLS options, from the public certificate."""
        return loadTLSOptions(
            tls,
            alpn=None if self.alpn is None else [*self.alpn],
            clientCA=self.clientCA,
            clientCAKey=self.clientCAKey,
        )


def listenerPolicy(settings: Settings, name: ListenerName) -> ListenerPolicy:
    """The policy of listener C{name} under C{settings}."""
    limits = settings.limits
    if name == "boot":
        return ListenerPolicy(name, limits.max_body_bytes)
    if name == "device":
        return ListenerPolicy(
            name,
            limits.max_body_bytes,
            clientCA=settings.pki.bundle,
            clientCAKey="pki.bundle",
        )
    if name == "admin":
        return ListenerPolicy(
            name,
            limits.admin_max_body_bytes,
            clientCA=settings.owner.client_ca,
            clientCAKey="owner.client_ca",
            largeBodiesForOwnersOnly=True,
        )
    if name in ("tink", "kms"):
        return ListenerPolicy(name, None, alpn=(b"h2",))
    raise ValueError(f"no listener named {name!r}")
