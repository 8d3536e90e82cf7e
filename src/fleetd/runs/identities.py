"""
The (uuid, serial) of each inventory device, indexed both ways.

The device flow [F4] asks, for every C{/device/code}, whether the uuid and
serial a node reported are an inventory device's; a dict from device name
to identity that also keeps the reverse indexes answers in O(1). A refused
attestation asks the same of a serial or a uuid alone, to name the device
it concerns (issue 27) without asking the inventory (NetBox) per refusal.
"""

from __future__ import annotations

from collections.abc import Iterable


class IdentityIndex(dict[str, tuple[str, str]]):
    """
    C{device -> (uuid, serial)}, uuids in lower case as the inventory keeps
    them, plus L{deviceByIdentity}. Only item assignment is supported as a
    change (what the run registry does).
    """

    def __init__(self) -> None:
        super().__init__()
        self._byUUID: dict[str, str] = {}
        self._bySerial: dict[str, str] = {}  # casefolded serial -> device

    def __setitem__(self, device: str, identity: tuple[str, str]) -> None:
        old = self.get(device)
        if old is not None:
            key = old[0].lower()  # the reverse index keeps it in lower case
            if self._byUUID.get(key) == device:
                del self._byUUID[key]
            if self._bySerial.get(old[1].casefold()) == device:
                del self._bySerial[old[1].casefold()]
        super().__setitem__(device, identity)
        uuid = identity[0]
        lower = uuid.lower()  # a new string, even when nothing changed:
        self._byUUID[uuid if lower == uuid else lower] = device  # keep one
        self._bySerial[identity[1].casefold()] = device

    def restore(self, identities: Iterable[tuple[str, str, str]]) -> None:
        """
        Add C{(device, uuid, serial)} triples (a start-up's, from
        L{fleetd.inventory.model.IInventory.identities}) in one pass.
        """
        if self:
            for device, uuid, serial in identities:
                self[device] = (uuid, serial)
            return
        byUUID, bySerial = self._byUUID, self._bySerial
        for device, uuid, serial in identities:
            dict.__setitem__(self, device, (uuid, serial))
            lower = uuid.lower()
            byUUID[uuid if lower == uuid else lower] = device
            bySerial[serial.casefold()] = device

    def deviceByIdentity(self, uuid: str, serial: str) -> str | None:
        """The device whose uuid and serial (any case) these are, if any."""
        device = self._byUUID.get(uuid.strip().lower())
        if device is None:
            return None
        known = self[device][1]
        return device if serial.strip().casefold() == known.casefold() else None

    def deviceBySerial(self, serial: str) -> str | None:
        """The device whose serial (any case) this is, if any."""
        return self._bySerial.get(serial.strip().casefold())

    def deviceByUUID(self, uuid: str) -> str | None:
        """The device whose uuid (any case) this is, if any."""
        return self._byUUID.get(uuid.strip().lower())
