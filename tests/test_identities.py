"""
L{fleetd.runs.identities.IdentityIndex}: device -> (uuid, serial), and
the reverse lookup the device flow [F4] asks.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from fleetd.runs.identities import IdentityIndex

UUID_MIXED = "4C4C4544-0042-3510-8050-B4C04F4D3232"
UUID_NEW = "4c4c4544-0042-3510-8050-b4c04f4d3233"


class IdentityIndexTests(SynchronousTestCase):
    def test_lookupAnyCase(self) -> None:
        """A uuid and serial in any case find their device."""
        index = IdentityIndex()
        index["w1"] = (UUID_MIXED, "SER1")
        self.assertEqual(index.deviceByIdentity(UUID_MIXED.lower(), "ser1"), "w1")
        self.assertEqual(index.deviceByIdentity(f" {UUID_MIXED} ", "SER1 "), "w1")
        self.assertIsNone(index.deviceByIdentity(UUID_MIXED, "SER2"))

    def test_changedUUID_oldOneFindsNothing(self) -> None:
        """
        A device whose uuid changed (kept in mixed case, as NetBox may hold
        it) is no longer found by its old uuid.
        """
        index = IdentityIndex()
        index["w1"] = (UUID_MIXED, "SER1")
        index["w1"] = (UUID_NEW, "SER1")
        self.assertIsNone(index.deviceByIdentity(UUID_MIXED, "SER1"))
        self.assertEqual(index.deviceByIdentity(UUID_NEW, "SER1"), "w1")

    def test_restore_thenChange(self) -> None:
        """A start-up's restore builds the same index item assignment does."""
        index = IdentityIndex()
        index.restore([("w1", UUID_MIXED, "SER1"), ("w2", UUID_NEW, "SER2")])
        self.assertEqual(index["w1"], (UUID_MIXED, "SER1"))
        self.assertEqual(index.deviceByIdentity(UUID_MIXED, "ser1"), "w1")
        self.assertEqual(index.deviceByIdentity(UUID_NEW, "SER2"), "w2")
        index.restore([("w1", UUID_NEW.replace("33", "44"), "SER1")])
        self.assertIsNone(index.deviceByIdentity(UUID_MIXED, "SER1"))
