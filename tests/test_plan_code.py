"""
Where the install plan's META 0x0b code comes from: the volatile vault,
written beside the configuration at provision, gone with it [C1] [V1].
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from fleetd.runs.machine import Outcome
from fleetd.runs.vaultnames import codeName, configName
from tests.fleetsupport import Fleet, device


class PlanCodeTests(SynchronousTestCase):
    def test_provision_keepsCodeBesideConfig(self) -> None:
        """A provision puts the run's code in the vault; the database holds a digest."""
        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        (run,) = fleet.provision(device("w1", "SER1"))
        self.assertEqual(fleet.vault.get(codeName(run.run)), run.code.encode())
        self.assertIn(configName(run.run), fleet.vault.names())
        digests = fleet.db.execute("SELECT digest FROM runs").fetchall()
        self.assertNotIn(run.code, str(digests))

    def test_delivered_codeLeavesWithConfig(self) -> None:
        """[C1] once the delivery is recorded, the code leaves with the body."""
        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        (run,) = fleet.provision(device("w1", "SER1"))
        self.assertEqual(fleet.fetch(run.code)[0], Outcome.DELIVER)
        self.assertNotIn(codeName(run.run), fleet.vault.names())
        self.assertNotIn(configName(run.run), fleet.vault.names())

    def test_superseded_codeGoes(self) -> None:
        """[V5] a new provision removes the old run's code; the new one is there."""
        fleet = Fleet(self)
        fleet.add(device("w1", "SER1"))
        (old,) = fleet.provision(device("w1", "SER1"))
        (new,) = fleet.provision(device("w1", "SER1"))
        self.assertNotIn(codeName(old.run), fleet.vault.names())
        self.assertEqual(fleet.vault.get(codeName(new.run)), new.code.encode())
