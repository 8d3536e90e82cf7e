"""
The Tink proxy's device index (L{fleetd.tink.workflows.DeviceIndex}): a
device added moments before its HookOS polls is linked to its workflow
from its next call on [B1] [B2], while ids that match nothing cost at
most one inventory listing a second, each on its own backoff.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import Device, validateDevice
from fleetd.tink.proto import tink_agent_pb2 as agent
from fleetd.tink.workflows import (
    FIRST_RETRY,
    REFRESH_EVERY,
    REFRESH_FLOOR,
    UNKNOWN_KEPT,
    DeviceIndex,
)
from tests.tinksupport import RUNNING, SUCCESS, Site

MAC2 = "52:54:00:00:00:02"


def device(name: str, mac: str) -> Device:
    return validateDevice(
        name=name,
        serial=f"SER-{name}",
        uuid="00000000-0000-4000-8000-0000000000" + mac[-2:],
        macs=[mac],
        device_class="worker",
    )


class Listed:
    """An inventory whose listings are counted; C{pending} holds them open."""

    def __init__(self) -> None:
        self.devices: list[Device] = []
        self.listings = 0
        self.pending: list[Deferred[list[Device]]] | None = None

    def list(self) -> Deferred[list[Device]]:
        self.listings += 1
        if self.pending is None:
            return succeed(list(self.devices))
        d: Deferred[list[Device]] = Deferred()
        self.pending.append(d)
        return d


class DeviceIndexTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.inventory = Listed()
        self.index = DeviceIndex(self.inventory, self.clock)
        self.successResultOf(self.index.refresh())

    def test_addedSecondsAfterListing_foundAtItsSecondCall(self) -> None:
        """A device added 5 s after the last listing: its first call lists
        again, and from its next call on the id is its device."""
        self.clock.advance(5)
        self.inventory.devices.append(device("w2", MAC2))
        self.index.lookup(MAC2)
        self.assertEqual(self.index.lookup(MAC2.upper()), "w2")
        self.assertEqual(self.inventory.listings, 2)

    def test_unknownId_ownBackoff(self) -> None:
        """An id that matches nothing lists again after 1 s, 2 s, 4 s...
        up to REFRESH_EVERY, never between."""
        gaps = []
        last = self.clock.seconds()
        listings = self.inventory.listings
        for _ in range(600):
            self.clock.advance(0.25)
            self.assertIsNone(self.index.lookup("52:54:00:ff:ff:ff"))
            if self.inventory.listings != listings:
                listings = self.inventory.listings
                gaps.append(self.clock.seconds() - last)
                last = self.clock.seconds()
        # the first waits for the floor after setUp's listing
        expected = [REFRESH_FLOOR] + [FIRST_RETRY * 2**n for n in range(5)]
        self.assertEqual(gaps[:6], expected)
        self.assertEqual(set(gaps[6:]), {REFRESH_EVERY})

    def test_manyUnknownIds_oneListingPerFloor(self) -> None:
        """A stranger naming a new MAC on every call: one listing per
        REFRESH_FLOOR seconds, and the ids it named are not all kept."""
        before = self.inventory.listings
        seconds = 20
        for i in range(seconds * 100):
            self.clock.advance(0.01)
            self.index.lookup(f"52:54:00:aa:{i >> 8 & 0xFF:02x}:{i & 0xFF:02x}")
        self.assertLessEqual(
            self.inventory.listings - before, seconds / REFRESH_FLOOR + 1
        )
        for i in range(UNKNOWN_KEPT + 10):
            self.clock.advance(REFRESH_FLOOR)
            self.index.lookup(f"unknown-{i}")
        self.assertLessEqual(len(self.index._unknown), UNKNOWN_KEPT)

    def test_listingInFlight_noSecond(self) -> None:
        """While a listing is under way, unknown ids wait for it; its end
        links the device added before it."""
        self.inventory.pending = []
        self.clock.advance(REFRESH_FLOOR)
        self.index.lookup(MAC2)
        self.clock.advance(REFRESH_FLOOR * 3)
        self.index.lookup(MAC2)
        self.index.lookup("52:54:00:ff:ff:fe")
        self.assertEqual(len(self.inventory.pending), 1)
        self.inventory.pending[0].callback([device("w2", MAC2)])
        self.assertEqual(self.index.lookup(MAC2), "w2")


class AddedThenPolledTests(SynchronousTestCase):
    def test_deviceAddedSecondsBeforeItsWorkflow_rebootingJournaled(self) -> None:
        """[B1] A rack added moments before it is powered on: the proxy's
        index listed the inventory before the device existed, the
        device's workflow runs 5 s later and its SUCCESS is journaled for
        its run (boot.rebooting), and its return to HookOS after it [B2]."""
        site = Site(self)
        fleet = site.fleet
        fleet.clock.advance(5)
        w2 = device("w2", MAC2)
        fleet.add(w2)
        fleet.provision(w2)
        fleet.clock.advance(5)
        request = agent.ActionRequest(agent_id=MAC2)
        for action in ("a0", "a1"):
            served = agent.ActionResponse(workflow_id="ns/w2", action_id=action)
            site.call("GetAction", 1, request, (served,))
            for state in (RUNNING, SUCCESS):
                report = agent.ActionStatusRequest(
                    workflow_id="ns/w2",
                    agent_id=MAC2,
                    action_id=action,
                    action_state=state,
                )
                site.call(
                    "ReportActionStatus", 1, report, (agent.ActionStatusResponse(),)
                )
        site.call("GetAction", 1, request, (), 9)
        self.assertEqual(fleet.events("w2"), ["run.provisioned", "boot.rebooting"])
        fleet.clock.advance(120)
        site.call("GetAction", 2, request, (), 9)
        self.assertEqual(fleet.events("w2").count("boot.hookos-after-install"), 1)


class ListingFloorTests(SynchronousTestCase):
    """Where a listing is dear (NetBox), a longer floor between listings:
    strangers naming MACs cost one listing per floor, not per second."""

    def test_floor_boundsListingsForUnknownIds(self) -> None:
        clock = Clock()
        clock.advance(1000)
        inventory = Listed()
        index = DeviceIndex(inventory, clock, floor=10.0)
        self.successResultOf(index.refresh())
        for i in range(100):  # 100 strangers' ids over 9.9 s
            clock.advance(0.099)
            index.lookup(f"52:54:00:00:01:{i:02x}")
        self.assertEqual(inventory.listings, 1)  # the first listing only
        clock.advance(0.2)
        index.lookup("52:54:00:00:02:00")
        self.assertEqual(inventory.listings, 2)
