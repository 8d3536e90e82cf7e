"""
How the device listener answers a node's refusal: the HTTP status for
each reason code (L{fleetd.nodes}), and C{Retry-After} on a busy answer.
"""

from __future__ import annotations

from twisted.web import http
from twisted.web.iweb import IRequest

from fleetd.nodes import (
    BUSY,
    CHALLENGE_EXPIRED,
    CHALLENGE_UNKNOWN,
    CHALLENGE_USED,
    CHALLENGES_PENDING,
    INVENTORY_AMBIGUOUS,
    LDEVID_REQUIRED,
    MALFORMED,
    NO_PLAN,
    NO_TARGET_DISK,
    Refused,
)
from fleetd.web.refusals import Answer, storeRefusal, withRetryAfter

STATUS_OF_REASON = {
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


def statusOf(refused: Refused) -> int:
    """The HTTP status the device listener answers C{refused} with."""
    return STATUS_OF_REASON.get(refused.reason, http.FORBIDDEN)


def nodeRefusal(error: Exception) -> tuple[int, str] | None:
    """The answer for a node's refusal or a failed change; L{None}: a bug."""
    if isinstance(error, Refused):
        return statusOf(error), error.line()
    return storeRefusal(error)


def answerFor(request: IRequest) -> Answer:
    """L{nodeRefusal}, with C{Retry-After} (L{withRetryAfter})."""
    return withRetryAfter(request, nodeRefusal)
