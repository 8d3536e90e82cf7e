"""
Whether a request's client is an operator: its certificate's purpose,
name and role.

TLS verified the chain against the owner CA; this module checks the
purpose (the clientAuth extended key usage must be there [O1]), the name
(the CN must fit the journal's actor names) and reads the role fixed in
the certificate (C{owner} or C{reader} [O4], L{fleetd.pki.owners}). The
admin listener's owner gate and its resources ask it; so does the admin
site, to decide which peers may send large bodies (owners only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.web.iweb import IRequest

from fleetd.pki.owners import (
    OWNER,
    OWNER_NAME,
    OWNER_NAME_RULE,
    RoleError,
    certificateRole,
)
from fleetd.web.peer import peerCertificate

# An owner's name is its certificate's CN (the rule: fleetd.pki.owners).
NO_CERTIFICATE = "owner client certificate required"


@dataclass(frozen=True)
class OwnerCheck:
    """
    An operator's name and role, or the one line saying why the peer is
    not one. C{owner} is the name (the CN) whatever the role.
    """

    owner: str | None
    refusal: str = NO_CERTIFICATE
    role: str = OWNER

    @property
    def actor(self) -> str | None:
        """The journal's actor for this operator (C{owner:NAME}, C{reader:NAME})."""
        return None if self.owner is None else f"{self.role}:{self.owner}"

    @property
    def mayChange(self) -> bool:
        """Whether this operator may change anything: an owner [O4]."""
        return self.owner is not None and self.role == OWNER


def checkOwner(request: IRequest) -> OwnerCheck:
    """
    Decide whether C{request}'s client is an owner [O1].

    The TLS layer has already verified the chain against the one owner CA.
    Here the verified chain must be exactly the leaf and the owner CA, the
    leaf's signature made by that CA (a leaf under an intermediate, such as
    an LDevID whose node sends its issuer along, is never an owner), the
    certificate must carry the clientAuth extended key usage (a certificate
    without that extension is refused: device and LDevID certificates
    often have none), must not be a CA, and its single CN must fit
    L{OWNER_NAME}. Its role is the one its certificate policies fix
    (L{certificateRole}: none is an owner, two or an unknown one are
    refused) [O4]. This relies on the owner CA being the admin listener's
    only trust anchor (L{fleetd.prepare.checkOwnerCA}): never add the LDevID
    bundle to that listener's TLS trust.
    """
    cert = peerCertificate(request)
    if cert is None:
        return OwnerCheck(None)
    transport = getattr(request, "transport", None)
    # The chain OpenSSL verified (sessions are not resumed: it is always there).
    getHandle = getattr(transport, "getHandle", None)
    getChain = getattr(getHandle() if getHandle else None, "get_verified_chain", None)
    verified = None if getChain is None else getChain()
    chain = [] if verified is None else [c.to_cryptography() for c in verified]
    try:
        if len(chain) != 2 or chain[0] != cert:
            raise ValueError("not leaf and owner CA")
        cert.verify_directly_issued_by(chain[1])
    except (ValueError, TypeError, InvalidSignature):
        return OwnerCheck(
            None, "owner certificate refused: it was not issued directly by the "
            "owner CA",
        )  # fmt: skip
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return OwnerCheck(
            None, "owner certificate refused: it has no extended key usage "
            "(clientAuth is required)",
        )  # fmt: skip
    if ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
        return OwnerCheck(
            None, "owner certificate refused: its extended key usage lacks clientAuth"
        )
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is not None and constraints.value.ca:
        return OwnerCheck(None, "owner certificate refused: it is a CA certificate")
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    values = [n.value for n in names]
    name = values[0] if len(values) == 1 else None
    if not isinstance(name, str) or OWNER_NAME.fullmatch(name) is None:
        shown = repr(name)[:70] if isinstance(name, str) else "missing or repeated"
        return OwnerCheck(
            None, f"owner certificate refused: its CN {shown} is not a usable owner "
            f"name ({OWNER_NAME_RULE})",
        )  # fmt: skip
    try:
        role = certificateRole(cert)
    except RoleError as e:
        return OwnerCheck(None, f"owner certificate refused: {e}")
    return OwnerCheck(name, role=role)


def ownerOf(request: IRequest) -> str | None:
    """The operator name (certificate CN) of C{request}'s client, or L{None}."""
    return checkOwner(request).owner


def roleOf(request: IRequest) -> str | None:
    """The role of C{request}'s client (L{OwnerCheck.role}), or L{None}."""
    checked = checkOwner(request)
    return None if checked.owner is None else checked.role


def actorOf(request: IRequest) -> str | None:
    """The journal's actor for C{request}'s client (L{OwnerCheck.actor})."""
    return checkOwner(request).actor


def isOwner(request: IRequest) -> bool:
    """
    Whether C{request}'s client presented an acceptable operator
    certificate whose role is C{owner} (a reader changes nothing, so it
    needs no large body [O2] [O4]).
    """
    return checkOwner(request).mayChange


# Names the owner behind a request (L{ownerOf}); resources take it injected.
OwnerOf = Callable[[IRequest], str | None]
# Names the role behind a request (L{roleOf}); the console takes it injected.
RoleOf = Callable[[IRequest], str | None]
