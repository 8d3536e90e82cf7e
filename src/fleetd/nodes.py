"""
Who a node is, and why fleetd refuses one: a stable reason code and one
line for people. The refusal is L{fleetd.refused.Refused}, the one the
owner's side raises too.

The codes are part of the wire contract (design.md, wire contract): C{fleetd-agent}
prints them, operators grep for them, and the journal records them. The
HTTP status each code is answered with belongs to the device listener
(L{fleetd.device.refusals}).
"""

from __future__ import annotations

from dataclasses import dataclass

# The class and the codes both sides use, named here too (explicit re-exports)
from fleetd.refused import BUSY as BUSY
from fleetd.refused import CLASS_REFUSED as CLASS_REFUSED
from fleetd.refused import MALFORMED as MALFORMED
from fleetd.refused import Refused as Refused


@dataclass(frozen=True)
class NodeIdentity:
    """
    The node behind a request, as its LDevID names it.

    @ivar device: the inventory name of the device (lowercase label).
    @ivar serial: its chassis serial, as the inventory spells it.
    """

    device: str
    serial: str


# [T2]
TPM12 = "tpm12-unsupported"
# [T3]
EK_UNTRUSTED = "ek-cert-untrusted"
EK_MISMATCH = "ek-public-mismatch"
EK_TEMPLATE = "ek-attributes"
NOT_APPROVED = "ek-binding-not-approved"
SERIAL_MISMATCH = "serial-mismatch"
UNKNOWN_DEVICE = "device-unknown"
AK_ATTRIBUTES = "ak-attributes"
LDEVID_ATTRIBUTES = "ldevid-attributes"
CHALLENGE_UNKNOWN = "challenge-unknown"
CHALLENGE_EXPIRED = "challenge-expired"
CHALLENGE_USED = "challenge-used"
CHALLENGES_PENDING = "challenges-pending"  # [T1] the EK's challenges are pending
ACTIVATION_FAILED = "activation-failed"
CERTIFY_INVALID = "certify-invalid"
CSR_INVALID = "csr-invalid"
# The inventory holds several devices for the serial or name a node names
INVENTORY_AMBIGUOUS = "inventory-ambiguous"
# [T4]
LDEVID_REQUIRED = "ldevid-required"
LDEVID_UNKNOWN = "ldevid-unknown"
LDEVID_SUPERSEDED = "ldevid-superseded"
LDEVID_NOT_OURS = "ldevid-not-current-issuer"
NOT_YOURS = "not-your-record"
ATTEST_REQUIRED = "attest-required"
# [R1] a device being decommissioned gets nothing more from fleetd
RETIRED = "device-retired"
NO_PLAN = "no-plan"
NO_TARGET_DISK = "target-disk-unknown"

# Every code above: a closed set, so a metric may use them as label values.
REASONS = frozenset(
    {
        TPM12, CLASS_REFUSED, EK_UNTRUSTED, EK_MISMATCH, EK_TEMPLATE,
        NOT_APPROVED, SERIAL_MISMATCH, UNKNOWN_DEVICE, AK_ATTRIBUTES,
        LDEVID_ATTRIBUTES, CHALLENGE_UNKNOWN, CHALLENGE_EXPIRED,
        CHALLENGE_USED, CHALLENGES_PENDING, ACTIVATION_FAILED,
        CERTIFY_INVALID, CSR_INVALID, MALFORMED, BUSY, INVENTORY_AMBIGUOUS,
        LDEVID_REQUIRED, LDEVID_UNKNOWN, LDEVID_SUPERSEDED, LDEVID_NOT_OURS,
        NOT_YOURS, ATTEST_REQUIRED, RETIRED, NO_PLAN, NO_TARGET_DISK,
    }
)  # fmt: skip
