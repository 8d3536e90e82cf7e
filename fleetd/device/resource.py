"""
The device listener's resource tree [A3].

C{/v1/attest/...}, C{/v1/ldevid/renew} and C{/v1/node/...} come from
L{fleetd.device.attest}; everything else is a one-line 404.
"""

from __future__ import annotations

from twisted.web.resource import Resource

from fleetd.web.resources import Router


def deviceRoot(v1: Resource | None = None) -> Router:
    root = Router()
    if v1 is not None:
        root.putChild(b"v1", v1)
    return root
