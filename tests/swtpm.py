"""
Real software TPMs for tests (L{fleetd.sim.tpm}, shared with the
simulator), and the test process's own D-Bus session bus for
tpm2-abrmd.

One L{SWTPM} per test class (setUpClass), each on its own free loopback
ports and state directory; L{SWTPM.stop} shuts it down cleanly.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

from fleetd.sim import tpm
from fleetd.sim.tpm import AVAILABLE, RM_AVAILABLE, SWTPM, SessionBus

__all__ = ["AVAILABLE", "RM_AVAILABLE", "SWTPM", "ResourceManager", "sessionBus"]

_bus: list[str] = []


def sessionBus(directory: Path) -> str:
    """
    The test process's own D-Bus session bus (started once; GLib keeps the
    first session bus it connects to for the life of the process), also
    put in C{DBUS_SESSION_BUS_ADDRESS} for the tabrmd TCTI.
    """
    if _bus:
        return _bus[0]
    bus = SessionBus(directory)
    address = bus.start()
    atexit.register(bus.stop)
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = address
    _bus.append(address)
    return address


class ResourceManager(tpm.ResourceManager):
    """tpm2-abrmd in front of one L{SWTPM}, on the test process's bus
    unless another is given."""

    def __init__(
        self, swtpm: SWTPM, directory: Path, bus: SessionBus | None = None
    ) -> None:
        super().__init__(swtpm, directory, bus)

    def sessionAddress(self) -> str:
        return sessionBus(self.directory)
