"""
The device listener's resource tree [A3].

Node resources live under C{/v1/node/}: each subsystem contributes its
children (e.g. C{disks}); every other path is a one-line 404.
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.web.resource import Resource

from fleetd.web import Router


def deviceRoot(node: Mapping[bytes, Resource] | None = None) -> Router:
    """The tree: C{/v1/node/<name>} for each of C{node}'s children."""
    root = Router()
    if node:
        below = Router()
        for name, child in node.items():
            below.putChild(name, child)
        v1 = Router()
        v1.putChild(b"node", below)
        root.putChild(b"v1", v1)
    return root
