"""
The boot listener's resource tree [A2].

It will serve C{POST /device/code}, C{POST /token} and C{GET /config} and
nothing else; until those land, every path is a one-line 404, C{/metrics}
and C{/healthz} included.
"""

from __future__ import annotations

from fleetd.web import Router


def bootRoot() -> Router:
    """Every path not registered here is 404 on the boot listener."""
    return Router()
