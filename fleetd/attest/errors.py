"""
Why fleetd refuses a node: a stable reason code and one line for people.

The codes are part of the wire contract (DESIGN §6): C{fleetd-agent}
prints them, operators grep for them, and the journal records them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from twisted.logger import Logger
from twisted.web import http

from fleetd.inventory.model import Device, DeviceStatus, InventoryError

# [T2]
TPM12 = "tpm12-unsupported"
CLASS_REFUSED = "class-refused"
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
MALFORMED = "malformed"
BUSY = "busy"
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

_STATUS = {
    MALFORMED: http.BAD_REQUEST,
    BUSY: http.SERVICE_UNAVAILABLE,
    CHALLENGE_UNKNOWN: http.NOT_FOUND,
    CHALLENGE_EXPIRED: http.GONE,
    CHALLENGE_USED: http.GONE,
    CHALLENGES_PENDING: 429,  # Too Many Requests
    LDEVID_REQUIRED: http.UNAUTHORIZED,
    NO_PLAN: http.NOT_FOUND,
    NO_TARGET_DISK: http.CONFLICT,
    INVENTORY_AMBIGUOUS: http.CONFLICT,
}


class Refused(Exception):
    """A refusal with its reason code; never carries a secret."""

    def __init__(self, reason: str, detail: str, retryAfter: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.retryAfter = retryAfter  # seconds, for a Retry-After header

    @property
    def status(self) -> int:
        """The HTTP status the device listener answers with."""
        return _STATUS.get(self.reason, http.FORBIDDEN)

    def line(self) -> str:
        """One line for the node: the code first, so agents can parse it."""
        return f"{self.reason}: {self.detail}"[:300]


def refuseRetired(device: Device) -> None:
    """
    [R1] A device in status C{decommissioning} is refused attestation,
    renewal, its plan, its record and the disk check.

    @raise Refused: C{device-retired}.
    """
    if device.status is DeviceStatus.DECOMMISSIONING:
        raise Refused(
            RETIRED,
            f"{device.name[:64]} is being decommissioned; fleetd issues it"
            " nothing more (no LDevID, plan or disk check)",
        )


_log = Logger(namespace="fleetd.attest")

# Seconds a node is told to wait (Retry-After) when fleetd answers busy.
RETRY_AFTER = 30

INVENTORY_BUSY = "the inventory cannot be asked now; retry later"
INVENTORY_AMBIGUOUS_LINE = (
    "the inventory holds more than one device for this machine;"
    " the owner must resolve it"
)


def busyWhileUnavailable(
    lookup: Callable[[str], Awaitable[Device | None]],
    *,
    bySerial: bool = False,
) -> Callable[[str], Awaitable[Device | None]]:
    """
    C{lookup} (the inventory's C{bySerial} or C{get}), refusing C{busy}
    while the inventory cannot be asked (NetBox down, hung, or refusing
    fleetd's token): a node's credential is never decided from a cache
    (issue 17 item 11). The line names no peer of fleetd's; the inventory
    logs and counts why. With C{bySerial}, several devices for the serial
    (a serial twice in NetBox) is refused with a line that names no
    device: the inventory's message names them all, and the other devices
    are none of the caller's business (issue 17 item 12). A name's
    duplicates share the caller's own name, so that line stays.

    @raise Refused: C{busy} (503, with Retry-After at the listener), or
        C{inventory-ambiguous} (409).
    """

    async def asked(key: str) -> Device | None:
        try:
            return await lookup(key)
        except InventoryError as e:
            if e.kind == "unavailable":
                raise Refused(BUSY, INVENTORY_BUSY) from e
            if bySerial and e.kind == "duplicate":
                _log.warn(
                    "attest.inventory-ambiguous {key}: {why}", key=key, why=str(e)
                )
                raise Refused(INVENTORY_AMBIGUOUS, INVENTORY_AMBIGUOUS_LINE) from e
            raise

    return asked
