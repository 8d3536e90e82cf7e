"""
Values of machine trust, checked and normalised.

An I{EK digest} is the lowercase hex SHA-256 of the DER
SubjectPublicKeyInfo of an EK public key (design.md, wire contract): input in
either case is accepted and stored lowercase. Serials follow the
inventory's rules (L{fleetd.inventory.model.validateSerial}) and compare
case-insensitively, as the inventory and NetBox do.
"""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

from fleetd.inventory.model import InventoryError, validateSerial
from fleetd.refused import Refused

ErrorKind = Literal["invalid", "not-found", "refused", "unavailable"]

MAX_REF = 128
_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
_EMPTY = hashlib.sha256(b"").hexdigest()


class TrustError(Refused):
    """
    A trust change was refused or could not be made; one line.

    A L{Refused} whose reason is its C{kind}, so the admin listener
    answers it from the one table (L{fleetd.admin.refusals}); its line
    (C{str}) is its detail, as it always was.

    @ivar kind: C{"invalid"} (bad input), C{"not-found"}, C{"refused"}
        (the rules say no: see C{code}) or C{"unavailable"}.
    @ivar code: a stable reason code for C{"refused"} (e.g.
        C{evidence-insufficient}), else L{None}; it begins the line.
    """

    def __init__(
        self, message: str, kind: ErrorKind = "invalid", code: str | None = None
    ) -> None:
        super().__init__(kind, f"{code}: {message}" if code else message)
        self.kind: ErrorKind = kind
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.detail


class EvidenceKind(enum.StrEnum):
    """Where a serial-to-EK claim comes from."""

    RECEIVING_SCAN = "receiving-scan"
    SUPPLIER_RECORD = "supplier-record"
    REPORTED_SERIAL = "reported-serial"
    PENDING_CLAIM = "pending-claim"
    CONSOLE = "console"

    @property
    def independent(self) -> bool:
        """Whether evidence of this kind can approve a binding [T1]."""
        return self in INDEPENDENT


INDEPENDENT = frozenset({EvidenceKind.RECEIVING_SCAN, EvidenceKind.SUPPLIER_RECORD})


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 70 else text[:67] + "..."


def validateEKDigest(value: object, field: str = "ek_sha256") -> str:
    """A SHA-256 EK digest: 64 hex digits, returned lowercase."""
    if not isinstance(value, str) or _DIGEST.fullmatch(value) is None:
        raise TrustError(
            f"{field}: {_show(value)} is not an EK digest (64 hex digits: the"
            " SHA-256 of the EK public key's DER SubjectPublicKeyInfo)"
        )
    digest = value.lower()
    if digest == _EMPTY:
        raise TrustError(f"{field}: {digest} is the SHA-256 of nothing, not of a key")
    return digest


def ekDigest(subjectPublicKeyInfo: bytes) -> str:
    """
    The EK digest of a DER SubjectPublicKeyInfo, hashed as given (never
    re-encoded: EK certificates carry quirks a re-encoding would change).
    """
    return hashlib.sha256(subjectPublicKeyInfo).hexdigest()


def validateKind(value: object) -> EvidenceKind:
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return EvidenceKind(value.lower())
    except ValueError:
        known = ", ".join(k.value for k in EvidenceKind)
        raise TrustError(f"kind: {_show(value)} is not one of {known}") from None


def validateRef(value: object) -> str | None:
    """An optional reference (scan id, order number, manifest name)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TrustError(f"ref: must be a string, not {_show(value)}")
    ref = value.strip()
    if not ref:
        return None
    if len(ref) > MAX_REF or not ref.isprintable() or "-----BEGIN" in ref:
        raise TrustError(
            f"ref: {_show(value)} must be at most {MAX_REF} printable characters"
        )
    return ref


def validateTrustSerial(value: object) -> str:
    try:
        return validateSerial(value)
    except InventoryError as e:
        raise TrustError(str(e)) from None


@dataclass(frozen=True)
class EvidenceInput:
    """One claim as an owner or a manifest gives it; build with L{evidence}."""

    serial: str
    ek_sha256: str
    kind: EvidenceKind
    ref: str | None = None


def evidence(
    *, serial: object, ek_sha256: object, kind: object, ref: object = None
) -> EvidenceInput:
    """Check and normalise one claim, naming the first bad field."""
    return EvidenceInput(
        serial=validateTrustSerial(serial),
        ek_sha256=validateEKDigest(ek_sha256),
        kind=validateKind(kind),
        ref=validateRef(ref),
    )


@dataclass(frozen=True)
class EvidenceRecord:
    """One recorded claim, with who recorded it and whether it stands."""

    id: int
    serial: str
    ek_sha256: str
    kind: EvidenceKind
    ref: str | None
    recorded_at: float
    recorded_by: str
    withdrawn_at: float | None = None
    withdrawn_by: str | None = None
    withdrawn_reason: str | None = None

    @property
    def live(self) -> bool:
        return self.withdrawn_at is None

    def toJSON(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "serial": self.serial,
            "ek_sha256": self.ek_sha256,
            "kind": self.kind.value,
            "independent": self.kind.independent,
            "ref": self.ref,
            "recorded_at": self.recorded_at,
            "recorded_by": self.recorded_by,
            "withdrawn": None
            if self.withdrawn_at is None
            else {
                "at": self.withdrawn_at,
                "by": self.withdrawn_by,
                "reason": self.withdrawn_reason,
            },
        }


@dataclass(frozen=True)
class BindingView:
    """
    An approved binding and whether it holds now.

    @ivar state: C{"approved"}, or C{"suspended"} when conflicting
        evidence arrived or its evidence was withdrawn (see C{problem}).
    """

    serial: str
    ek_sha256: str
    device: str
    evidence: int
    approved_at: float
    approved_by: str
    state: str
    problem: str | None

    def toJSON(self) -> dict[str, Any]:
        return {
            "serial": self.serial,
            "ek_sha256": self.ek_sha256,
            "device": self.device,
            "evidence": self.evidence,
            "approved_at": self.approved_at,
            "approved_by": self.approved_by,
            "state": self.state,
            "problem": self.problem,
        }
