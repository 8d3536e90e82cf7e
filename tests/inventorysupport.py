"""Device records for inventory tests, and a runner that always fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from twisted.internet.defer import Deferred, fail

from fleetd.inventory import Device, validateDevice
from fleetd.inventory.defined import SiteDefinitions
from fleetd.store import Database

_T = TypeVar("_T")

UUID1 = "4c4c4544-0042-3510-8052-b4c04f384833"
UUID2 = "4c4c4544-0042-3510-8052-b4c04f384834"
UUID3 = "4c4c4544-0042-3510-8052-b4c04f384835"


def device(
    name: str = "w1",
    serial: str = "SN-0001",
    uuid: str = UUID1,
    macs: tuple[str, ...] = ("52:54:00:00:00:01",),
    device_class: str = "worker-g3",
    cluster: str | None = "folly",
) -> Device:
    return validateDevice(
        name=name,
        serial=serial,
        uuid=uuid,
        macs=macs,
        device_class=device_class,
        cluster=cluster,
    )


# The classes the test site defines (as tests.support.writeConfig's), and
# the clusters whose templates it has.
CLASSES = ("worker", "worker-g1", "worker-g2", "worker-g3", "control-plane")
SITE = SiteDefinitions(CLASSES, lambda: ["big", "default", "folly"], "templates")

W1 = device()
W2 = device("w2", "SN-0002", UUID2, ("52:54:00:00:00:02", "52:54:00:00:00:12"))
W3 = device("w3", "SN-0003", UUID3, (), cluster=None)


class FailingRunner:
    """A runner whose every call fails as a stopped or broken database does."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def run(self, f: Callable[[Database], _T]) -> Deferred[_T]:
        return fail(self.error)
