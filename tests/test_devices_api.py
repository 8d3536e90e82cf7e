"""
Tests for C{/v1/admin/devices} and C{fleetctl device ...}.

L{DevicesResourceTests} drive the resource in memory (StubTreq, inline
database); L{DevicesDaemonTests} and L{DeviceCommandTests} go through the
real daemon over TLS with the owner certificate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.admin.devices import devicesResource
from fleetd.inventory import SQLiteInventory
from fleetd.store import AsyncJournal, Database, InlineRunner, Journal, StoreError
from fleetd.web.resources import Router
from tests.daemonsupport import DaemonTestMixin, httpsRequest
from tests.fleetctlsupport import fleetctlAgainst, ownerConfig
from tests.inventorysupport import SITE, UUID1, UUID2, UUID3, FailingRunner
from tests.inventorysupport import W1 as DEVICE_W1
from tests.ownersupport import CSV, W1, inline
from tests.support import inventoryOver

W1_STORED = {**W1, "status": "inventory", "desired_action": None}
BASE = "https://admin.test/devices"


NaN = float("nan")


class DevicesResourceTests(SynchronousTestCase):
    """The devices resource in memory: bodies, codes, journal entries."""

    def setUp(self) -> None:
        db = Database.open(Path(self.mktemp()) / "fleetd.sqlite3")
        self.addCleanup(db.close)
        runner = InlineRunner(db)
        self.journal = AsyncJournal(runner, Journal(b"k" * 32), Clock())
        self.inventory = SQLiteInventory(runner, self.journal)
        self.stub = self.treqFor(
            devicesResource(self.inventory, self.journal, offload=inline, defined=SITE)
        )

    def treqFor(self, devices: Any) -> Any:
        """A StubTreq (its request methods are made at run time: Any)."""
        root = Router()
        root.putChild(b"devices", devices)
        return StubTreq(root)

    def call(
        self, method: str, url: str, body: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        d = self.stub.request(method, url, data=body)
        self.stub.flush()
        response = self.successResultOf(d)
        content = self.successResultOf(response.content())
        ctype = response.headers.getRawHeaders(b"content-type", [b""])[0]
        return response.code, ctype, content

    def post(self, document: Any) -> tuple[int, bytes, bytes]:
        return self.call("POST", BASE, json.dumps(document).encode())

    def events(self) -> list[tuple[str, str, str | None, dict[str, Any]]]:
        entries = self.successResultOf(self.journal.query())
        return [(e.event, e.actor, e.device, dict(e.fields)) for e in entries]

    def test_post_createsAndJournals(self) -> None:
        """POST adds the device: 201, its JSON, a Location and device.added."""
        d = self.stub.post(BASE, data=json.dumps({**W1, "name": "W1"}).encode())
        self.stub.flush()
        response = self.successResultOf(d)
        self.assertEqual(response.code, 201)
        self.assertEqual(
            response.headers.getRawHeaders(b"location"), [b"/v1/admin/devices/w1"]
        )
        self.assertEqual(
            json.loads(self.successResultOf(response.content())), W1_STORED
        )
        self.assertEqual(
            self.events(),
            [
                (
                    "device.added",
                    "owner:unknown",
                    "w1",
                    {
                        "serial": "SN-1",
                        "uuid": UUID1,
                        "class": "worker-g3",
                        "cluster": "folly",
                        "macs": 1,
                    },
                )
            ],
        )

    def test_post_optionalFieldsAbsent(self) -> None:
        """macs and cluster may be left out (or cluster null)."""
        bare = {k: v for k, v in W1.items() if k not in ("macs", "cluster")}
        code, _, body = self.post(bare)
        self.assertEqual((code, json.loads(body)["macs"]), (201, []))
        code, _, body = self.post(
            {**bare, "name": "w2", "serial": "S2", "uuid": UUID2, "cluster": None}
        )
        self.assertEqual((code, json.loads(body)["cluster"]), (201, None))

    def test_post_badBodies_400OneLine(self) -> None:
        """Malformed or invalid bodies get 400 and one line naming the problem."""
        cases: list[tuple[bytes, str]] = [
            (b"", "body: not JSON"),
            (b"{", "body: not JSON"),
            (b"[]", "body: must be a JSON object"),
            (b"\xff{}", "body: not UTF-8"),
            (json.dumps({**W1, "rack": "r1"}).encode(), "body: unknown key 'rack'"),
            (b'{"name": "w1", "name": "w2"}', "body: key 'name' appears twice"),
            (json.dumps({**W1, "macs": "52:54:00:00:00:01"}).encode(), "macs: must"),
            (json.dumps({**W1, "macs": [1]}).encode(), "macs: must be a list of str"),
            (json.dumps({**W1, "name": 7}).encode(), "name: must be a JSON str"),
            (json.dumps({**W1, "cluster": 1}).encode(), "cluster: must be a JSON str"),
            (json.dumps({**W1, "serial": NaN}).encode(), "body: NaN is not JSON"),
            (
                json.dumps({k: v for k, v in W1.items() if k != "uuid"}).encode(),
                "uuid: missing",
            ),
            (json.dumps({**W1, "uuid": "nope"}).encode(), "uuid: 'nope' is not"),
            (json.dumps({**W1, "name": "w_1"}).encode(), "name: 'w_1' is not"),
        ]
        for body, expected in cases:
            code, ctype, text = self.call("POST", BASE, body)
            self.assertEqual((code, ctype), (400, b"text/plain; charset=utf-8"), body)
            line = text.decode()
            self.assertTrue(line.startswith(expected), (body, line))
            self.assertEqual(line.count("\n"), 1)
        self.assertEqual(self.successResultOf(self.inventory.list()), [])
        self.assertEqual(self.events(), [])

    def test_post_duplicate_409(self) -> None:
        """A second device with a taken serial gets 409 naming the field."""
        self.post(W1)
        code, _, body = self.post({**W1, "name": "w2", "uuid": UUID2, "macs": []})
        self.assertEqual(
            (code, body), (409, b"serial SN-1 already belongs to device w1\n")
        )
        self.assertEqual([e[0] for e in self.events()], ["device.added"])

    def test_get_listAndShow(self) -> None:
        """GET lists all devices; GET NAME shows one, case-insensitively."""
        self.assertEqual(json.loads(self.call("GET", BASE)[2]), {"devices": []})
        self.post(W1)
        self.assertEqual(
            json.loads(self.call("GET", BASE)[2]), {"devices": [W1_STORED]}
        )
        self.assertEqual(
            json.loads(self.call("GET", BASE + "/")[2]), {"devices": [W1_STORED]}
        )
        code, ctype, body = self.call("GET", BASE + "/W1")
        self.assertEqual(
            (code, ctype, json.loads(body)), (200, b"application/json", W1_STORED)
        )

    def test_get_unknown_404Line(self) -> None:
        """An unknown device, or a deeper path, is a one-line 404."""
        self.post(W1)
        for path in ("/w9", "/w1/extra", "/%ff", "//w1"):
            code, _, body = self.call("GET", BASE + path)
            self.assertEqual(code, 404, path)
            self.assertEqual(body.count(b"\n"), 1, path)
        self.assertEqual(self.call("GET", BASE + "/w9")[2], b"no device named w9\n")

    def test_methods_405(self) -> None:
        """Unsupported methods get a one-line 405 naming the allowed ones."""
        self.post(W1)
        cases = [
            ("PUT", "", b"GET, HEAD, POST"),
            ("DELETE", "/w1", b"GET, HEAD"),
            ("POST", "/w1", b"GET, HEAD"),
            ("PUT", "/import", b"GET, HEAD, POST"),
        ]
        for method, path, allowed in cases:
            d = self.stub.request(method, BASE + path)
            self.stub.flush()
            response = self.successResultOf(d)
            body = self.successResultOf(response.content())
            self.assertEqual(
                (response.code, body), (405, b"method not allowed\n"), (method, path)
            )
            self.assertEqual(response.headers.getRawHeaders(b"allow"), [allowed])

    def test_import_allAndJournal(self) -> None:
        """
        POST import adds every row, answers the count, and journals each
        device as added (via import) in the same transaction [J1].
        """
        code, _, body = self.call("POST", BASE + "/import", CSV.encode())
        self.assertEqual((code, json.loads(body)), (200, {"imported": 2}))
        names = [d.name for d in self.successResultOf(self.inventory.list())]
        self.assertEqual(names, ["w2", "w3"])
        self.assertEqual(
            [(e[0], e[1], e[2], e[3]["via"]) for e in self.events()],
            [
                ("device.added", "owner:unknown", "w2", "import"),
                ("device.added", "owner:unknown", "w3", "import"),
            ],
        )

    def test_import_badRow_400WithLine(self) -> None:
        """A bad row rejects the whole CSV with 400 and its line number."""
        bad = CSV + "w4,SN-4,not-a-uuid,,worker,\n"
        code, _, body = self.call("POST", BASE + "/import", bad.encode())
        self.assertEqual(code, 400)
        self.assertTrue(body.startswith(b"line 4: uuid:"), body)
        self.assertEqual(self.successResultOf(self.inventory.list()), [])
        self.assertEqual(self.events(), [])

    def test_import_parsedOffTheReactorThread(self) -> None:
        """
        An import's body is decoded and parsed by the offload (a worker
        thread in the daemon), not during the request: until that work is
        done nothing is answered; a bad row still rejects the whole file
        with its line number.
        """
        held: list[tuple[Callable[[bytes], Any], bytes, Deferred[Any]]] = []

        def hold(work: Callable[[bytes], Any], data: bytes) -> Deferred[Any]:
            d: Deferred[Any] = Deferred()
            held.append((work, data, d))
            return d

        self.stub = self.treqFor(
            devicesResource(self.inventory, self.journal, offload=hold, defined=SITE)
        )
        bad = CSV + "w4,SN-4,not-a-uuid,,worker,\n"
        for body, expected in [(CSV, 200), (bad, 400)]:
            d = self.stub.post(BASE + "/import", data=body.encode())
            self.stub.flush()
            self.assertNoResult(d)
            work, data, pending = held.pop()
            self.assertEqual(data, body.encode())
            try:
                pending.callback(work(data))
            except Exception:
                pending.errback()
            self.stub.flush()
            response = self.successResultOf(d)
            content = self.successResultOf(response.content())
            self.assertEqual(response.code, expected, content)
        self.assertTrue(content.startswith(b"line 4: uuid:"), content)
        names = [d.name for d in self.successResultOf(self.inventory.list())]
        self.assertEqual(names, ["w2", "w3"])

    def test_import_invalidUTF8_400(self) -> None:
        """A CSV body that is not UTF-8 is refused with 400."""
        code, _, body = self.call("POST", BASE + "/import", b"name\xff\n")
        self.assertEqual((code, body), (400, b"body: not UTF-8 (byte 4)\n"))

    def test_import_clashWithExisting_409Nothing(self) -> None:
        """A row clashing with an existing device rejects the import (409)."""
        self.post({**W1, "serial": "SN-3", "uuid": UUID1})
        code, _, body = self.call("POST", BASE + "/import", CSV.encode())
        self.assertEqual(
            (code, body),
            (409, b"device w3: serial SN-3 already belongs to device w1\n"),
        )
        names = [d.name for d in self.successResultOf(self.inventory.list())]
        self.assertEqual(names, ["w1"])

    def test_deviceCalledImport_stillShown(self) -> None:
        """GET /devices/import shows a device that is called import."""
        self.post({**W1, "name": "import"})
        code, _, body = self.call("GET", BASE + "/import")
        self.assertEqual((code, json.loads(body)["name"]), (200, "import"))

    def test_unavailable_503(self) -> None:
        """When the database cannot be used the answer is a one-line 503."""
        broken = inventoryOver(FailingRunner(StoreError("runner stopped")))
        self.stub = self.treqFor(
            devicesResource(broken, self.journal, offload=inline, defined=SITE)
        )
        code, _, body = self.call("GET", BASE)
        self.assertEqual(code, 503)
        self.assertEqual(body, b"inventory database unavailable: runner stopped\n")


class DevicesDaemonTests(DaemonTestMixin, TestCase):
    """The devices API through the real daemon, behind the owner gate."""

    def setUp(self) -> None:
        self.makeSettings()

    async def test_devicesAPI_overTLS(self) -> None:
        """
        Add, import, list and show through the admin listener; an unknown
        device is a 404 line, no owner certificate a 403; additions are
        journaled with the owner as actor.
        """
        service = self.startDaemon()
        port = self.port(service, "admin")
        owner = (self.pki.owner_cert, self.pki.owner_key)

        async def call(
            method: str, path: str, body: bytes | None = None, cert: Any = owner
        ) -> tuple[int, bytes]:
            csv = path.endswith("/import")
            ctype = "text/csv" if csv else "application/json"
            return await deferToThread(
                httpsRequest, port, method, path, self.pki.public_ca, cert, body,
                None if body is None else ctype,
            )  # fmt: skip

        status, body = await call("POST", "/v1/admin/devices", json.dumps(W1).encode())
        self.assertEqual((status, json.loads(body)), (201, W1_STORED))
        status, body = await call("POST", "/v1/admin/devices/import", CSV.encode())
        self.assertEqual((status, json.loads(body)), (200, {"imported": 2}))
        status, body = await call("GET", "/v1/admin/devices")
        names = [d["name"] for d in json.loads(body)["devices"]]
        self.assertEqual((status, names), (200, ["w1", "w2", "w3"]))
        status, body = await call("GET", "/v1/admin/devices/w1")
        self.assertEqual((status, json.loads(body)), (200, W1_STORED))
        status, body = await call("GET", "/v1/admin/devices/w9")
        self.assertEqual((status, body), (404, b"no device named w9\n"))
        status, body = await call("GET", "/v1/admin/devices", cert=None)
        self.assertEqual((status, body), (403, b"owner client certificate required\n"))

        status, body = await call("GET", "/v1/admin/journal")
        entries = [
            (e["event"], e["actor"], e["device"], e["fields"])
            for e in json.loads(body)["entries"]
            if e["event"].startswith("device.")
        ]
        self.assertEqual(
            [e[:3] for e in entries],
            [
                ("device.added", "owner:owner", "w1"),
                ("device.added", "owner:owner", "w2"),
                ("device.added", "owner:owner", "w3"),
            ],
        )
        self.assertEqual(entries[1][3]["via"], "import")

    async def test_inventory_survivesRestart(self) -> None:
        """The embedded inventory lives in the state database across restarts."""
        first = self.startDaemon()
        await first.inventory.add(DEVICE_W1, journal=())
        await first.stopService()
        second = self.startDaemon()
        self.assertEqual([d.name for d in await second.inventory.list()], ["w1"])


class DeviceCommandTests(DaemonTestMixin, TestCase):
    """fleetctl device add|list|show|import against a running daemon."""

    def setUp(self) -> None:
        self.makeSettings()

    async def fleetctl(self, *argv: str) -> tuple[int, str, str]:
        """Run fleetctl; a single argument is split on spaces."""
        words = argv[0].split() if len(argv) == 1 else list(argv)
        return await fleetctlAgainst(self.config, *words)

    def start(self) -> None:
        service = self.startDaemon()
        port = self.port(service, "admin")
        self.config = str(ownerConfig(self.directory, port))

    async def test_device_addListShow(self) -> None:
        """
        fleetctl device add (text and --json), list (columns, --json before
        or after the action), show (key: value, --json); refusals are one
        line on stderr with a non-zero exit.
        """
        self.start()
        code, out, err = await self.fleetctl(
            f"device add W1 --serial SN-1 --uuid {UUID1.upper()}"
            " --mac 52-54-00-00-00-01 --class worker-g3 --cluster folly"
        )
        self.assertEqual((code, out, err), (0, "added device w1\n", ""))
        code, out, err = await self.fleetctl(
            f"--json device add w2 --serial SN-2 --uuid {UUID2} --class control-plane"
        )
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out)["name"], "w2")

        code, out, _ = await self.fleetctl("device list --json")
        self.assertEqual(code, 0)
        listed = json.loads(out)
        self.assertEqual(listed[0], W1_STORED)
        self.assertEqual([d["name"] for d in listed], ["w1", "w2"])

        code, out, _ = await self.fleetctl("device list")
        self.assertEqual(
            out.splitlines(),
            [
                "NAME  SERIAL  CLASS          CLUSTER  STATUS",
                "w1    SN-1    worker-g3      folly    inventory",
                "w2    SN-2    control-plane  -        inventory",
            ],
        )

        code, out, _ = await self.fleetctl("device show w1")
        self.assertEqual(
            out.splitlines(),
            [
                "name: w1",
                "serial: SN-1",
                f"uuid: {UUID1}",
                "macs: 52:54:00:00:00:01",
                "class: worker-g3",
                "cluster: folly",
                "status: inventory",
                "desired_action: -",
            ],
        )
        code, out, _ = await self.fleetctl("--json device show w1")
        self.assertEqual(json.loads(out), W1_STORED)

        code, out, err = await self.fleetctl("device show w9")
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(err, "fleetctl: fleetd answered 404: no device named w9\n")

        code, _, err = await self.fleetctl(
            f"device add w3 --serial SN-1 --uuid {UUID3} --class worker"
        )
        self.assertEqual(code, 1)
        self.assertEqual(
            err,
            "fleetctl: fleetd answered 409: serial SN-1 already belongs to device w1\n",
        )
        code, _, err = await self.fleetctl(
            "device add w3 --serial SN-3 --uuid nope --class worker"
        )
        self.assertEqual(code, 1)
        self.assertTrue(err.startswith("fleetctl: device add: uuid: 'nope'"), err)
        self.assertEqual(err.count("\n"), 1)

        code, out, _ = await self.fleetctl("--json journal --device w1")
        self.assertEqual([e["event"] for e in json.loads(out)], ["device.added"])

    async def test_device_address(self) -> None:
        """
        Issue 30: fleetctl device add --address stores the node's address
        (canonical), show prints it after the MACs, fleetctl status names
        it in the headline; a bad one is refused locally, one line.
        """
        self.start()
        code, _, err = await self.fleetctl(
            f"device add w1 --serial SN-1 --uuid {UUID1} --class worker-g3"
            " --address 2001:DB8::0:7"
        )
        self.assertEqual((code, err), (0, ""))
        code, out, _ = await self.fleetctl("device show w1")
        self.assertEqual(out.splitlines()[3:5], ["macs: -", "address: 2001:db8::7"])
        code, out, _ = await self.fleetctl("status w1")
        self.assertTrue(out.splitlines()[0].endswith("  address 2001:db8::7"), out)
        code, out, err = await self.fleetctl(
            f"device add w2 --serial SN-2 --uuid {UUID2} --class worker-g3"
            " --address 10.0.0.0/8"
        )
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(
            err,
            "fleetctl: device add: address: '10.0.0.0/8' has a prefix length;"
            " give the address alone\n",
        )

    async def test_device_import(self) -> None:
        """
        fleetctl device import: a bad file is refused locally with its line
        number (exit 1, one line, nothing imported); a good file imports
        every row; a clash with the inventory is fleetd's one-line 409.
        """
        self.start()
        good = self.directory / "good.csv"
        good.write_text(CSV)
        bad = self.directory / "bad.csv"
        bad.write_text(CSV + "\nw4,SN-4,not-a-uuid,,worker,\n")

        code, out, err = await self.fleetctl("device", "import", str(bad))
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(err.count("\n"), 1)
        self.assertIn("line 5: uuid: 'not-a-uuid'", err)

        code, out, err = await self.fleetctl("device", "import", str(good))
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out, f"imported 2 devices from {good}\n")

        code, out, err = await self.fleetctl("--json", "device", "import", str(good))
        line = "fleetd answered 409: device w2: name w2 is already in the inventory"
        self.assertEqual((code, err), (1, f"fleetctl: {line}\n"))
        self.assertEqual(
            json.loads(out), {"error": line, "status": 1, "http_status": 409}
        )

        code, _, err = await self.fleetctl(
            "device", "import", str(self.directory / "no.csv")
        )
        self.assertEqual(code, 1)
        self.assertIn("cannot read", err)
        self.assertEqual(err.count("\n"), 1)

        code, out, _ = await self.fleetctl("--json device list")
        self.assertEqual([d["name"] for d in json.loads(out)], ["w2", "w3"])
        code, out, _ = await self.fleetctl("--json journal")
        imported = [
            e["device"]
            for e in json.loads(out)
            if e["event"] == "device.added" and e["fields"].get("via") == "import"
        ]
        self.assertEqual(imported, ["w2", "w3"])
