"""
C{fleetd-sim --inventory netbox}: the rack against the NetBox fake
(L{fleetd.testing.netbox}, the one the tests use), which the sim's own
fleetd names in its C{[netbox]} table, so NetBox is the inventory of
record (docs/operations.md, "Running with NetBox").

The fake is served over plain http on loopback in the sim's process,
with fleetd's custom fields on C{dcim.device} already there. Devices are
created in NetBox, not through fleetd (C{fleetctl device add} refuses
with NetBox): the sim enters each node as an operator would in NetBox's
UI (L{enterDevice}), then records its evidence and approves its binding
with fleetctl as on the embedded inventory. At the end each node's
status in NetBox must be the one fleetd reports, with the release of a
delivered configuration (L{fleetd.sim.checks.mirrored}): fleetd's outbox
pushed them.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from twisted.internet.interfaces import IListeningPort
from twisted.web.server import Site

from fleetd.testing.netbox import FakeNetBox


def serveNetBox(
    reactor: Any, work: Path
) -> tuple[FakeNetBox, IListeningPort, dict[str, Any]]:
    """The fake on a free loopback port; the C{[netbox]} table naming it."""
    # A v2 token of the fake's, write enabled, new each run.
    token = f"nbt_sim{secrets.token_hex(3)}.{secrets.token_urlsafe(18)}"
    fake = FakeNetBox(tokens={token: True}, basePath="/netbox/")
    port: IListeningPort = reactor.listenTCP(0, Site(fake), interface="127.0.0.1")
    tokenFile = work / "netbox-token"
    tokenFile.write_text(token + "\n")
    number = port.getHost().port  # type: ignore[attr-defined]
    table = {"url": f"http://127.0.0.1:{number}/netbox/", "token_file": str(tokenFile)}
    return fake, port, table


def enterDevice(
    fake: FakeNetBox, *, name: str, serial: str, uuid: str, mac: str, deviceClass: str
) -> int:
    """A node entered in NetBox as an operator would: a C{dcim.device} in
    C{inventory} with its serial, its interface's MAC, C{fleetd_uuid} and
    C{fleetd_class}."""
    return fake.addDevice(
        name,
        serial,
        status="inventory",
        uuid=uuid,
        deviceClass=deviceClass,
        macs=(("eth0", mac.upper(), False),),
    )
