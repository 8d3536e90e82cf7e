"""The errors of L{fleetd.k8s.client}: what a caller may do next."""

from __future__ import annotations

import json


class KubeError(Exception):
    """A call failed; C{code} is the HTTP status when there was one."""

    def __init__(self, message: str, code: int | None = None, reason: str = ""):
        super().__init__(message)
        self.code = code
        self.reason = reason


class KubeUnavailable(KubeError):
    """The API could not be reached or answered 5xx/429: try again later."""


class NotFound(KubeError):
    """404: no such object."""


class Conflict(KubeError):
    """409: a stale resourceVersion (Conflict) or a taken name (AlreadyExists)."""


class Gone(KubeError):
    """410: the resourceVersion asked for is older than the server's history."""


class Invalid(KubeError):
    """422 (or 400): the server refused the object as malformed."""


def errorFor(code: int, body: bytes, what: str) -> KubeError:
    reason, message = "", ""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            reason = str(doc.get("reason") or "")
            message = str(doc.get("message") or "")
    except ValueError:
        pass
    line = f"{what}: {code} {reason or 'error'}" + (
        f": {message[:200]}" if message else ""
    )
    if code == 404:
        return NotFound(line, code, reason)
    if code == 409:
        return Conflict(line, code, reason)
    if code == 410:
        return Gone(line, code, reason)
    if code in (400, 422):
        return Invalid(line, code, reason)
    if code >= 500 or code == 429:
        return KubeUnavailable(line, code, reason)
    return KubeError(line, code, reason)
