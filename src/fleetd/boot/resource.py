"""
The boot listener's resource tree [A2].

It serves C{POST /device/code}, C{POST /token} and C{GET /config} and
nothing else: every other path is a one-line 404, C{/metrics} and
C{/healthz} included.
"""

from __future__ import annotations

from twisted.web.resource import Resource

from fleetd.web.resources import Router


def bootRoot(
    config: Resource | None = None,
    deviceCode: Resource | None = None,
    token: Resource | None = None,
) -> Router:
    """The boot tree; every path not registered here is 404."""
    root = Router()
    if config is not None:
        root.putChild(b"config", config)
    if token is not None:
        root.putChild(b"token", token)
    if deviceCode is not None:
        device = Router()
        device.putChild(b"code", deviceCode)
        root.putChild(b"device", device)
    return root
