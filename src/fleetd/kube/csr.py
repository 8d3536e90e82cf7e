"""
What a kubelet client CSR says, and whether it is kubelet-shaped.

Pure functions over the API object (no I/O): L{readCSR} parses the PEM
request with C{cryptography}; L{shapeRefusal} applies the kubelet client
signer's rules (notes kube-netbox.md section 2.1, C{ValidateKubeletClientCSR}):
O exactly C{[system:nodes]}, CN C{system:node:<name>}, no SANs of any
kind, usages C{{digital signature, client auth}} (plus C{key
encipherment} for RSA keys), and an C{expirationSeconds}, if any, within
policy.
"""

from __future__ import annotations

import base64
import datetime
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from fleetd.k8s.client import KUBELET_CLIENT_SIGNER

NODE_PREFIX = "system:node:"
BOOTSTRAP_PREFIX = "system:bootstrap:"
BASE_USAGES = frozenset({"digital signature", "client auth"})
RSA_USAGES = BASE_USAGES | {"key encipherment"}
MAX_EXPIRATION = 367 * 86400


@dataclass(frozen=True)
class CSRFacts:
    """The parts of a CSR the approver decides on."""

    name: str
    uid: str
    signer: str
    username: str
    groups: tuple[str, ...]
    usages: frozenset[str]
    expirationSeconds: int | None
    commonNames: tuple[str, ...]
    organizations: tuple[str, ...]
    hasSANs: bool
    rsaKey: bool
    approved: bool
    denied: bool
    reason: str  # of the Approved condition, when there is one
    certificate: bytes | None

    @property
    def node(self) -> str | None:
        """The node the subject names, when its CN is C{system:node:<name>}."""
        if len(self.commonNames) == 1 and self.commonNames[0].startswith(NODE_PREFIX):
            return self.commonNames[0][len(NODE_PREFIX) :] or None
        return None


class Unreadable(ValueError):
    """The CSR object or its PEM request cannot be read."""


def readCSR(obj: dict[str, Any]) -> CSRFacts:
    """
    Total: every failure to read C{obj} is L{Unreadable}, never another
    error (issue 17). A requester can file a request whose extensions
    C{cryptography} refuses (a malformed basicConstraints: kube-apiserver,
    like Go, parses only the SAN extension), so the extensions, the public
    key, C{expirationSeconds} and the certificate are all read here, once,
    inside the guard; the approver never parses the request again.

    @raise Unreadable: not a CSR object, or a part of it cannot be read.
    """
    try:
        return _read(obj)
    except Unreadable:
        raise
    except Exception as e:
        raise Unreadable(f"unreadable CSR: {e.__class__.__name__}") from e


def _read(obj: dict[str, Any]) -> CSRFacts:
    meta = obj["metadata"]
    spec = obj["spec"]
    status = obj.get("status") or {}
    pem = base64.b64decode(spec["request"], validate=True)
    request = x509.load_pem_x509_csr(pem)
    try:
        request.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        sans = True
    except x509.ExtensionNotFound:
        sans = False
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    certificate = status.get("certificate")
    expiration = spec.get("expirationSeconds")
    return CSRFacts(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        signer=str(spec.get("signerName", "")),
        username=str(spec.get("username", "")),
        groups=tuple(str(g) for g in spec.get("groups") or ()),
        usages=frozenset(str(u) for u in spec.get("usages") or ()),
        expirationSeconds=None if expiration is None else int(expiration),
        commonNames=tuple(
            str(a.value)
            for a in request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        ),
        organizations=tuple(
            str(a.value)
            for a in request.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        ),
        hasSANs=sans,
        rsaKey=isinstance(request.public_key(), rsa.RSAPublicKey),
        approved="Approved" in conditions,
        denied="Denied" in conditions,
        reason=str((conditions.get("Approved") or {}).get("reason", "")),
        certificate=base64.b64decode(certificate) if certificate else None,
    )


def describe(obj: Any) -> tuple[str, str, str]:
    """
    The name, uid and requester of an object L{readCSR} could not read,
    as far as they can be told (C{"?"} otherwise): for its journal entry.
    """

    def part(where: Any, key: str) -> str:
        value = where.get(key) if isinstance(where, dict) else None
        return value if isinstance(value, str) and value else "?"

    meta = obj.get("metadata") if isinstance(obj, dict) else None
    spec = obj.get("spec") if isinstance(obj, dict) else None
    return part(meta, "name"), part(meta, "uid"), part(spec, "username")


def approvedFirst(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """
    One LIST's CSRs with the approved ones first, each group in its order
    [K2]: a token an approved CSR used (recorded late) is marked before
    any pending CSR on it is decided, whatever names the requesters chose.
    """

    def approved(item: Any) -> bool:
        try:
            conditions = item["status"]["conditions"]
            return any(c.get("type") == "Approved" for c in conditions)
        except Exception:
            return False

    return sorted(items, key=lambda item: not approved(item))


def shapeRefusal(facts: CSRFacts) -> str | None:
    """Why C{facts} is not a kubelet client CSR, or L{None} when it is."""
    if facts.signer != KUBELET_CLIENT_SIGNER:
        return "wrong-signer"
    if facts.organizations != ("system:nodes",):
        return "wrong-organization"
    if facts.node is None:
        return "wrong-common-name"
    if facts.hasSANs:
        return "has-subject-alternative-names"
    allowed = (RSA_USAGES,) if facts.rsaKey else (BASE_USAGES, RSA_USAGES)
    if facts.usages not in allowed:
        return "wrong-usages"
    if facts.expirationSeconds is not None and not (
        600 <= facts.expirationSeconds <= MAX_EXPIRATION
    ):
        return "expiration-out-of-policy"
    return None


def notAfter(certificate: bytes) -> float | None:
    """The issued certificate's notAfter (epoch seconds), if it parses."""
    try:
        cert = x509.load_pem_x509_certificate(certificate)
        moment: datetime.datetime = cert.not_valid_after_utc
        return moment.timestamp()
    except Exception:
        return None


def stillPending(csr: dict[str, Any], uid: str) -> bool:
    """Approve only the object decided on: same uid, still undecided."""
    if (csr.get("metadata") or {}).get("uid") != uid:
        return False
    conditions = (csr.get("status") or {}).get("conditions") or []
    return not any(c.get("type") in ("Approved", "Denied") for c in conditions)
