"""
Node identity from the verified LDevID client certificate [T4].

TLS has already checked the chain against the trust bundle (issuer,
capsule and forge) and the validity period. Here the certificate must
name a node (CN = device, serialNumber = chassis serial, as L{Issuer}
writes them) and be acceptable for that node now: an LDevID from the
current issuer must be the node's current one in the records, and a
legacy (capsule/forge) LDevID is accepted only until the node has an
LDevID from the current issuer (it renewed or attested through spore).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography import x509

from fleetd.nodes import (
    LDEVID_NOT_OURS,
    LDEVID_REQUIRED,
    LDEVID_SUPERSEDED,
    LDEVID_UNKNOWN,
    NodeIdentity,
    Refused,
)
from fleetd.pki.ldevid import TrustBundle, serialHex, subjectOf
from fleetd.pki.records import LDevIDRecord, loadCurrent
from fleetd.store.db import Database


class LDevIDBook:
    """Each node's current LDevID record, in memory, changed after commits."""

    def __init__(self) -> None:
        self._current: dict[str, LDevIDRecord] = {}

    def load(self, db: Database) -> None:
        """Read every node's current record (at start, before any listener)."""
        for record in loadCurrent(db):
            self._current[record.chassis.lower()] = record

    def current(self, chassis: str) -> LDevIDRecord | None:
        return self._current.get(chassis.lower())

    def issued(self, record: LDevIDRecord) -> None:
        """C{record} committed as its node's current LDevID."""
        self._current[record.chassis.lower()] = record

    def status(self, chassis: str) -> dict[str, Any] | None:
        """The owner's status view of the node's current LDevID, if any."""
        record = self.current(chassis)
        if record is None:
            return None
        # Every record is from the one issuer: the node has cut over [T4].
        return {**record.toJSON(), "legacy": False}


@dataclass(frozen=True)
class Peer:
    """A node that presented an acceptable LDevID."""

    identity: NodeIdentity
    cert: x509.Certificate
    issuer: str
    legacy: bool


class LDevIDIdentifier:
    """Decides which node a client certificate names."""

    def __init__(self, bundle: TrustBundle, book: LDevIDBook) -> None:
        self._bundle = bundle
        self._book = book

    def check(self, cert: x509.Certificate | None) -> Peer:
        """
        The node behind C{cert}, the client certificate TLS verified.

        @raise Refused: no certificate, or one not acceptable (any more).
        """
        if cert is None:
            raise Refused(
                LDEVID_REQUIRED, "this resource needs an LDevID client certificate"
            )
        return self.checkCertificate(cert)

    def checkCertificate(self, cert: x509.Certificate) -> Peer:
        found = self._bundle.issuerOf(cert)
        subject = subjectOf(cert)
        if found is None or subject is None:
            raise Refused(
                LDEVID_UNKNOWN, "certificate is not an LDevID from the trust bundle"
            )
        ca, current = found
        record = self._book.current(subject.serial)
        if current:
            if record is None or record.cert_serial != serialHex(cert):
                if record is None:
                    raise Refused(LDEVID_UNKNOWN, "no record of this LDevID")
                raise Refused(
                    LDEVID_SUPERSEDED, "a newer LDevID was issued to this node"
                )
            if record.device != subject.device:
                raise Refused(LDEVID_UNKNOWN, "LDevID names another device")
        elif record is not None:
            raise Refused(
                LDEVID_NOT_OURS,
                "this node renewed through this fleetd; only its LDevID from the"
                " current issuer is accepted",
            )
        identity = NodeIdentity(device=subject.device, serial=subject.serial)
        return Peer(identity, cert, ca.subject.rfc4514_string(), legacy=not current)
