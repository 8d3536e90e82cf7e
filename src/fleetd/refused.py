"""
Why fleetd refuses a request: one L{Refused}, a stable reason code and one
line for people, raised wherever a refusal is decided (the subsystems, the
node's and the owner's resources, the console's forms); and the reason
codes of the owner's side. The node's codes are in L{fleetd.nodes}.

Nothing here knows HTTP: each listener turns a reason into its status
(L{fleetd.device.refusals} for a node, L{fleetd.admin.refusals} for the
owner), so the same refusal is answered alike wherever it is met.
"""

from __future__ import annotations

# Both sides
MALFORMED = "malformed"  # the request cannot be read
BUSY = "busy"  # fleetd cannot answer now: retry later

# The owner's side (the admin API and the console)
TOO_LARGE = "too-large"  # a body past its bound
FORBIDDEN = "forbidden"  # this owner may not, or not from there
NOT_FOUND = "not-found"  # no such device, run or request
UNCONFIRMED = "unconfirmed"  # a change the owner did not confirm
CLASS_REFUSED = "class-refused"  # [T2] the device's class cannot install
SERIAL_AMBIGUOUS = "serial-ambiguous"  # the inventory names a serial twice
TEMPLATE = "template"  # the device's template cannot be rendered
DECOMMISSIONING = "decommissioning"  # [R1] a retired device
STALE = "stale"  # what the owner confirmed has moved on: confirm again
CONFLICT = "conflict"  # the fleet's state stands in the way
UNAVAILABLE = "unavailable"  # a peer or the store cannot be asked now


class Refused(Exception):
    """A refusal with its reason code; never carries a secret."""

    def __init__(self, reason: str, detail: str, retryAfter: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.retryAfter = retryAfter  # seconds, for a Retry-After header

    def line(self) -> str:
        """One line with the code first, so agents and scripts can parse it."""
        return f"{self.reason}: {self.detail}"[:300]
