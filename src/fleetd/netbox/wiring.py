"""
The NetBox inventory's wiring: its client from the settings, and the
digest of a run's configuration its release carries.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from fleetd.config import NetBoxSettings
from fleetd.netbox.connect import makeClient
from fleetd.netbox.inventory import digestOf
from fleetd.netbox.service import NetBoxService
from fleetd.reactors import IHTTPClientReactor
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner


def netboxService(
    reactor: IHTTPClientReactor,
    netbox: NetBoxSettings,
    runner: IRunner,
    journal: AsyncJournal,
    *,
    configOf: Callable[[str], bytes | None],
    onRefused: Callable[[str], None],
    metrics: CollectorRegistry,
) -> NetBoxService:
    """
    The NetBox service (its C{inventory} is fleetd's) for C{[netbox]};
    C{configOf(run)} is a run's configuration, if it is still there.
    """
    return NetBoxService(
        reactor,
        makeClient(reactor, netbox.url, netbox.token_file, netbox.ca),
        runner,
        journal,
        configDigest=lambda run: digestOf(configOf(run)),
        onRefused=onRefused,
        metrics=metrics,
    )
