"""
How the admin listener answers an owner's refusal, in the owner API and in
the console alike: the HTTP status of each reason code, in one table, and
the one line. A refusal is a L{Refused} (L{fleetd.refused}): the owner's
reason codes, and the subsystems' refusals that are L{Refused} with their
kind as the reason (trust's L{TrustError}, the device flow's
L{DeviceFlowError}, the cluster tokens' L{ClusterTokenError}).

An owner's line is the refusal's detail; the reasons in L{NAMED} begin it
with their code, as the owner API always answered them (C{busy: ...},
C{class-refused: ...}), and so does every refusal of the device flow and
of the cluster tokens (L{NAMED_KINDS}: C{expired: ...}, C{no-cluster:
...}). Each C{*Refusal} below maps what one family of commands can meet
to C{(status, line)}, or L{None} for a bug; the console shows the same
line the API answers.
"""

from __future__ import annotations

from twisted.logger import Logger
from twisted.web import http

from fleetd.deviceflow.model import DeviceFlowError
from fleetd.inventory.model import InventoryError
from fleetd.k8s.client import KubeError
from fleetd.kube.cluster import ClusterTokenError
from fleetd.refused import (
    BUSY,
    CLASS_REFUSED,
    CONFLICT,
    DECOMMISSIONING,
    FORBIDDEN,
    MALFORMED,
    NOT_FOUND,
    SERIAL_AMBIGUOUS,
    STALE,
    TEMPLATE,
    TOO_LARGE,
    UNAVAILABLE,
    UNCONFIRMED,
    Refused,
)
from fleetd.runs.provision import NotReady
from fleetd.trust.model import TrustError
from fleetd.web.refusals import inventoryRefusal, storeRefusal

log = Logger(namespace="fleetd.admin.trust")  # where trust refusals were always logged

# The owner's reason codes, then the subsystems' error kinds (the device
# flow's, the cluster tokens', trust's), one status each.
STATUS_OF_REASON: dict[str, int] = {
    MALFORMED: http.BAD_REQUEST,
    UNCONFIRMED: http.BAD_REQUEST,
    FORBIDDEN: http.FORBIDDEN,
    NOT_FOUND: http.NOT_FOUND,
    TOO_LARGE: http.REQUEST_ENTITY_TOO_LARGE,
    CLASS_REFUSED: http.CONFLICT,
    SERIAL_AMBIGUOUS: http.CONFLICT,
    TEMPLATE: http.CONFLICT,
    DECOMMISSIONING: http.CONFLICT,
    STALE: http.CONFLICT,
    CONFLICT: http.CONFLICT,
    BUSY: http.SERVICE_UNAVAILABLE,
    UNAVAILABLE: http.SERVICE_UNAVAILABLE,
    # the kinds of DeviceFlowError, ClusterTokenError and TrustError
    "invalid": http.BAD_REQUEST,
    "unknown-user-code": http.NOT_FOUND,
    "unknown-device": http.NOT_FOUND,
    "already-decided": http.CONFLICT,
    "being-decided": http.CONFLICT,
    "no-ready-run": http.CONFLICT,
    "mismatch": http.CONFLICT,
    "no-cluster": http.CONFLICT,
    "refused": http.CONFLICT,
    "expired": http.GONE,
    "too-many-attempts": 429,  # Too Many Requests
    "not-recorded": http.SERVICE_UNAVAILABLE,
}

# The reasons an owner's line begins with.
NAMED = frozenset({BUSY, CLASS_REFUSED, SERIAL_AMBIGUOUS, TEMPLATE, DECOMMISSIONING})
# The refusals whose every line begins with its reason (their kind).
NAMED_KINDS = (DeviceFlowError, ClusterTokenError)


def statusOf(refused: Refused) -> int:
    """The HTTP status the admin listener answers C{refused} with."""
    return STATUS_OF_REASON.get(refused.reason, http.FORBIDDEN)


def lineOf(refused: Refused) -> str:
    """The one line the owner is shown for C{refused}."""
    if refused.reason in NAMED or isinstance(refused, NAMED_KINDS):
        return f"{refused.reason}: {refused.detail}"
    return refused.detail


def ownerRefusal(error: Exception) -> tuple[int, str] | None:
    """A L{Refused}, or a change the store could not record (L{None}: a bug)."""
    if isinstance(error, Refused):
        return statusOf(error), lineOf(error)
    return storeRefusal(error)


def kubeRefusal(error: Exception) -> tuple[int, str] | None:
    """
    A refused Kubernetes credential command or retirement (a
    L{ClusterTokenError} is a L{Refused}, answered by L{ownerRefusal}).
    """
    if isinstance(error, KubeError):
        return http.SERVICE_UNAVAILABLE, f"kubernetes: {error}; nothing changed"
    if isinstance(error, NotReady):  # a retirement right after a start
        return http.SERVICE_UNAVAILABLE, f"{error}; nothing changed"
    if isinstance(error, InventoryError) and error.kind == "not-found":
        return http.NOT_FOUND, f"not-found: {error}"
    return ownerRefusal(error)


def trustRefusal(error: Exception) -> tuple[int, str] | None:
    """A refused trust change (logged)."""
    if isinstance(error, TrustError):
        log.warn("trust.refused {kind} {reason}", kind=error.kind, reason=str(error))
        return statusOf(error), lineOf(error)
    if isinstance(error, InventoryError) and error.kind == "invalid":
        return http.BAD_REQUEST, str(error)
    return ownerRefusal(error)


def decisionRefusal(error: Exception) -> tuple[int, str] | None:
    """A refused device-flow decision."""
    if isinstance(error, DeviceFlowError):
        return statusOf(error), lineOf(error)
    return None


def journalRefusal(error: Exception) -> tuple[int, str] | None:
    """A journal query's refusal: a name fleetd never knew, or the inventory's."""
    if isinstance(error, Refused):
        return statusOf(error), lineOf(error)
    if isinstance(error, InventoryError):
        return inventoryRefusal(error)
    return None
