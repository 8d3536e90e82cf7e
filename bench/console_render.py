"""
The owner console's fleet view C{/} at 10,000 devices: time per page.

Runs fleetd's real service in-process (database thread, SQLite on disk,
vault on tmpfs) over a fresh directory, imports N devices into the
embedded SQLite inventory (two clusters, one MAC each), provisions runs
for many of them through the admin API, delivers some (consumed), marks
a few active or failed, retires a few (their latest run superseded),
opens alert series for some (as their nodes' requests would) and leaves
a few device-flow requests pending. Then it renders fleet pages through
the real console resource (the gate, L{fleetd.admin.console.fleet.Fleet},
L{fleetd.fleet.view.FleetView}, Jinja2) R times each, in turn:

  - the first page (C{/}),
  - a filtered page (C{/?status=planned&cluster=folly}),
  - a search by serial (C{/?q=sn0000123}, 10 matches), and by part of a
    MAC (C{/?q=00:0a:1}, 16 matches),
  - a late page (C{/?page=90} at 10,000 devices),

and reports mean, p50 and p95 of the wall time per page (from the
request until its last byte, with the inventory read on the database
thread), once with the database unchanged between pages and once after
a write before each page (the inventory's listing is then read anew:
L{fleetd.inventory.sqlite_rows.DeviceListing}); and separately the parts:
the inventory listing (database thread, wall), the filtering (reactor
thread), the page's data (the filtering, then runs and alerts of its rows
and a database read for retired devices) and the template render.

    .venv/bin/python bench/console_render.py [--devices 10000]
        [--provision 5000] [--rounds 50]

Provisioning is the slow part of the set-up (about 7 s per 1,000 runs
here); rendering takes a few seconds. Loopback only.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import ssl
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._fleet import (
    Admin,
    configPath,
    getConfig,
    makeFleet,
    makeNodes,
    tlsContext,
)

PAGES = {
    "first page": "/",
    "filtered": "/?status=planned&cluster=folly",
    "search (serial)": "/?q=sn0000123",
    "search (MAC)": "/?q=00:0a:1",
    "late page": "/?page={late}",  # the tenth page from the end
}
FIELDS = ("status", "cluster", "q", "page")


def ms(values: Sequence[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (
        f"mean {statistics.fmean(values) * 1000:6.1f}"
        f"  p50 {statistics.median(values) * 1000:6.1f}"
        f"  p95 {p95 * 1000:6.1f} ms"
    )


def mac(i: int) -> str:
    return f"52:54:00:00:{i // 256:02x}:{i % 256:02x}"


def deviceCode(
    port: int, context: ssl.SSLContext, form: dict[str, str], source: str
) -> int:
    """A node's device authorization request on the boot listener."""
    conn = http.client.HTTPSConnection(
        "localhost", port, timeout=30, context=context, source_address=(source, 0)
    )
    try:
        conn.request(
            "POST",
            "/device/code",
            body=urllib.parse.urlencode(form).encode(),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


async def build(service: Any, reactor: Any, fleet: Any, args: Any) -> None:
    """The fleet: devices, runs, deliveries, statuses, retirements, alerts."""
    from twisted.internet.threads import deferToThread

    from fleetd.inventory.model import DeviceStatus, validateDevice
    from fleetd.runs.alerts import MISSING, REFETCHED
    from fleetd.store.entries import Entry

    nodes = makeNodes(args.devices)
    devices = [
        validateDevice(
            name=n.name,
            serial=n.serial,
            uuid=n.uuid,
            macs=[mac(i)],
            device_class=n.device_class,
            cluster="folly" if i % 2 else "default",
        )
        for i, n in enumerate(nodes)
    ]
    began = time.monotonic()
    entry = Entry("device.imported", actor="owner:bench", fields={"count": len(nodes)})
    await service.inventory.importDevices(devices, journal=[entry])
    print(f"imported {len(nodes)} devices in {time.monotonic() - began:.1f} s")

    admin = Admin(fleet, service.listeners["admin"].port.getHost().port)
    chosen = [n.name for n in nodes[: args.provision]]
    began = time.monotonic()
    runs = await deferToThread(admin.provision, chosen)
    print(f"provisioned {len(runs)} runs in {time.monotonic() - began:.1f} s")

    context = tlsContext(fleet.pki.public_ca)
    boot = service.listeners["boot"].port.getHost().port
    byName = {n.name: n for n in nodes}

    def deliver(names: list[str]) -> None:
        for name in names:
            status, _ = getConfig(
                boot, context, configPath(byName[name], runs[name][1])
            )
            if status != 200:
                raise SystemExit(f"{name}: delivery answered {status}")

    delivered = chosen[: args.provision // 10]
    await deferToThread(deliver, delivered)
    for name in delivered[: len(delivered) // 2]:
        await service.inventory.setStatus(name, DeviceStatus.ACTIVE, journal=[])
    for name in chosen[-50:]:
        await service.inventory.setStatus(name, DeviceStatus.FAILED, journal=[])
    for name in chosen[-80:-50]:
        await service.console.retire.retire(name, "owner:bench")
    # Alert series as the nodes' requests would open them (in memory).
    for name in chosen[1000:1300]:
        service.alerts.note(MISSING, name, stored=False)
    for name in delivered[:100]:
        service.alerts.note(REFETCHED, name, stored=False)
    for i in range(5):
        form = {"client_id": "talos", "uuid": nodes[-1 - i].uuid, "serial": f"X{i}"}
        status = await deferToThread(deviceCode, boot, context, form, f"127.0.1.{i}")
        if status != 200:
            raise SystemExit(f"device code answered {status}")
    print(
        f"delivered {len(delivered)}, retired 30, 300 + 100 alerts open,"
        f" {len(service.deviceFlow.pending())} device-flow requests pending"
    )


async def measure(service: Any, reactor: Any, rounds: int, size: int) -> None:
    from twisted.internet.defer import Deferred
    from twisted.web.test.requesthelper import DummyRequest

    from fleetd.admin.console.page import renderPage
    from fleetd.admin.console.tree import consoleTree, fleetView
    from fleetd.fleet.view import fleetQuery, select

    tree = consoleTree(
        service.console, service.consoleSessions, reactor, owner=lambda _: "bench"
    )
    view = fleetView(service.console, reactor)
    late = max(1, -(-size // view.pageSize) - 10)
    pages = {name: path.format(late=late) for name, path in PAGES.items()}

    async def page(path: str) -> tuple[int, bytes]:
        request = DummyRequest([b""])
        request.uri = path.encode()
        request.args = urllib.parse.parse_qs(urllib.parse.urlsplit(request.uri).query)
        done: Deferred[None] = request.notifyFinish()
        result = tree.index.render(request)
        if isinstance(result, bytes):  # an error page written at once
            request.write(result)
            request.finish()
        await done
        return request.responseCode or 200, b"".join(request.written)

    for name, path in pages.items():
        code, body = await page(path)
        if code != 200:
            raise SystemExit(f"{path}: {code} {body[:300]!r}")
        rows = body.count(b'<td><a href="/devices/')
        print(f"{name:16} {path:36} {rows:3} rows, {len(body) / 1000:.0f} kB")

    async def change() -> None:
        """A write to the database: the inventory's listing is read anew."""
        await service.inventory.setDesiredAction("node-00001", None, journal=[])

    for changed in (False, True):
        print(
            f"\nwall time per page, {rounds} rounds (request to last byte),"
            + (" each after a change" if changed else " the database unchanged")
        )
        for name, path in pages.items():
            times = []
            for _ in range(rounds):
                if changed:
                    await change()
                began = time.perf_counter()
                await page(path)
                times.append(time.perf_counter() - began)
            print(f"  {name:16} {ms(times)}")

    print("\nits parts:")
    for changed in (False, True):
        listing = []
        for _ in range(rounds):
            if changed:
                await change()
            began = time.perf_counter()
            devices = await service.inventory.list()
            listing.append(time.perf_counter() - began)
        how = "read anew" if changed else "kept"
        print(f"  inventory.list(), {how:9} {ms(listing)}  (database thread, wall)")
    for name, path in pages.items():
        fields = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        query = fleetQuery(*(fields.get(k, [None])[0] for k in FIELDS))
        filtering, gathering, rendering = [], [], []
        for _ in range(rounds):
            began = time.perf_counter()
            select(devices, query)
            filtering.append(time.perf_counter() - began)
            began = time.perf_counter()
            fleet = await view.pageOf(devices, query)
            gathering.append(time.perf_counter() - began)
            began = time.perf_counter()
            renderPage(
                DummyRequest([b""]),  # type: ignore[arg-type]
                "fleet.html",
                fleet=fleet,
                statuses=[],
                refresh=None,
            )
            rendering.append(time.perf_counter() - began)
        print(f"  {name:16} filter    {ms(filtering)}  (reactor thread)")
        print(f"  {'':16} page data {ms(gathering)}  (filter, rows, runs, alerts)")
        print(f"  {'':16} template  {ms(rendering)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--provision", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    if (
        not 1000 <= args.devices <= 100_000
        or not 1500 <= args.provision <= args.devices
    ):
        parser.error("--devices 1000..100000, --provision 1500..devices")

    from twisted.internet import reactor
    from twisted.internet.defer import Deferred

    from fleetd.config import loadSettings
    from fleetd.service import FleetdService, prepare

    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    work = Path(tempfile.mkdtemp(prefix="fleetd-console-render-"))
    shm = Path(tempfile.mkdtemp(prefix="fleetd-console-render-", dir="/dev/shm"))
    fleet = makeFleet(work / "fleet", shm / "vault")
    r: Any = reactor
    service = FleetdService(prepare(loadSettings(fleet.config)), r)
    failed: list[BaseException] = []

    async def run() -> None:
        try:
            await service.loading.whenReady()
            await build(service, r, fleet, args)
            await measure(service, r, args.rounds, args.devices)
        except BaseException as e:
            failed.append(e)
            raise
        finally:
            await service.stopService()
            r.stop()

    service.privilegedStartService()
    service.startService()
    r.callWhenRunning(lambda: Deferred.fromCoroutine(run()))
    try:
        r.run()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    if failed:
        raise SystemExit(f"failed: {failed[0]!r}")


if __name__ == "__main__":
    main()
