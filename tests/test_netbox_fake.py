"""
Contract tests of the fake NetBox (L{fleetd.testing.netbox}): the
documented behaviours fleetd relies on (notes/kube-netbox.md section 6,
NetBox v4.6.8 source), run against the fake through C{StubTreq} and over
a real loopback HTTPS connection with a private CA and a base path (which
also exercises L{fleetd.netbox.connect}).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import treq
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.ssl import PrivateCertificate
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Site

from fleetd.netbox.client import NetBoxClient, NetBoxError, authorization, checkURL
from fleetd.netbox.connect import NetBoxSetupError, makeClient
from fleetd.pki.dev import ensureDevPKI
from fleetd.reactors import fleetdReactor
from fleetd.testing.netbox import FakeNetBox

TOKEN = "nbt_fleetd01.s3cret"
if TYPE_CHECKING:
    _Base = TestCase
else:
    _Base = object

V1 = "0123456789abcdef0123456789abcdef01234567"
UUID = "4c4c4544-0042-3510-8052-b4c04f384833"


class NetBoxAPIContractMixin(_Base):
    """
    What fleetd relies on from NetBox's REST API. Subclasses set
    C{self.fake} and implement L{request}.
    """

    fake: FakeNetBox
    base = "/netbox/"

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        token: str | None = TOKEN,
        ifMatch: str | None = None,
    ) -> tuple[int, Any, str | None]:
        raise NotImplementedError()

    async def test_list_pagination(self) -> None:
        """Lists carry count, next, previous, results; 50 a page; next to the end."""
        for n in range(120):
            self.fake.addDevice(f"w{n:03d}", f"SN{n}")
        code, page, _ = await self.request("GET", "api/dcim/devices/")
        self.assertEqual((code, page["count"], len(page["results"])), (200, 120, 50))
        self.assertIsNone(page["previous"])
        names = [d["name"] for d in page["results"]]
        following = page["next"]
        while following:
            path = following.split(self.base, 1)[1]
            _, page, _ = await self.request("GET", path)
            names += [d["name"] for d in page["results"]]
            following = page["next"]
        self.assertEqual(names, [f"w{n:03d}" for n in range(120)])
        _, capped, _ = await self.request("GET", "api/dcim/devices/?limit=5000")
        self.assertEqual(len(capped["results"]), 120)  # MAX_PAGE_SIZE is 1000

    async def test_filters_caseInsensitive(self) -> None:
        """?serial= and ?name__ie= match case-insensitively; ?name= exactly."""
        self.fake.addDevice("Worker-1", "abc-01")
        _, bySerial, _ = await self.request("GET", "api/dcim/devices/?serial=ABC-01")
        _, byName, _ = await self.request("GET", "api/dcim/devices/?name__ie=worker-1")
        _, exact, _ = await self.request("GET", "api/dcim/devices/?name=worker-1")
        self.assertEqual(
            (bySerial["count"], byName["count"], exact["count"]), (1, 1, 0)
        )

    async def test_serialFilter_everyDeviceOfThatSerial(self) -> None:
        """
        ?serial= is iexact (DeviceFilterSet, NetBox 4.6.8) and serials are
        not unique: it answers every device whose serial matches in any
        case, which fleetd refuses as ambiguous (issue 17 item 12).
        """
        self.fake.addDevice("w1", "SER1")
        self.fake.addDevice("w9", "ser1")
        self.fake.addDevice("w2", "SER10")
        _, page, _ = await self.request("GET", "api/dcim/devices/?serial=Ser1")
        self.assertEqual([d["name"] for d in page["results"]], ["w1", "w9"])

    async def test_primaryIPs_nestedAsDeviceSerializerDoes(self) -> None:
        """
        A device carries primary_ip4, primary_ip6 and the read-only
        primary_ip, each a nested IP address (its brief fields plus
        dns_name, nat_inside, nat_outside; the address with its prefix),
        null when unset; primary_ip is the IPv6 one unless PREFER_IPV4
        (C{Device.primary_ip}, NetBox 4.6.8).
        """
        ident = self.fake.addDevice("w1", "S1", primary=("192.0.2.5/24",))
        self.fake.addDevice("w2", "S2")
        _, page, _ = await self.request("GET", "api/dcim/devices/")
        w1, w2 = page["results"]
        four = w1["primary_ip4"]
        self.assertEqual(
            sorted(four),
            sorted(
                "id url display family address description dns_name"
                " nat_inside nat_outside".split()
            ),
        )
        self.assertEqual(
            (four["address"], four["display"], four["family"]),
            ("192.0.2.5/24", "192.0.2.5/24", {"value": 4, "label": "IPv4"}),
        )
        self.assertEqual((w1["primary_ip"], w1["primary_ip6"]), (four, None))
        self.assertEqual(
            (w2["primary_ip"], w2["primary_ip4"], w2["primary_ip6"]), (None,) * 3
        )
        self.fake.setPrimaryIP(ident, "2001:db8::5/64")
        _, w1, _ = await self.request("GET", f"api/dcim/devices/{ident}/")
        self.assertEqual(w1["primary_ip"]["address"], "2001:db8::5/64")
        self.assertEqual(w1["primary_ip6"]["family"]["value"], 6)
        self.fake.preferIPv4 = True
        _, w1, _ = await self.request("GET", f"api/dcim/devices/{ident}/")
        self.assertEqual(w1["primary_ip"]["address"], "192.0.2.5/24")

    async def test_unknownFilter_ignored(self) -> None:
        """A filter NetBox does not know is ignored (so clients check answers)."""
        self.fake.addDevice("w1", "S1")
        self.fake.addDevice("w2", "S2")
        _, page, _ = await self.request("GET", "api/dcim/devices/?nonsense=w1")
        self.assertEqual(page["count"], 2)

    async def test_detail_etagAndIfMatch(self) -> None:
        """Details carry an ETag; a stale If-Match is 412 and changes nothing."""
        ident = self.fake.addDevice("w1", "S1")
        path = f"api/dcim/devices/{ident}/"
        _, _, etag = await self.request("GET", path)
        assert etag is not None
        self.assertIn('W/"', etag)
        code, _, newer = await self.request(
            "PATCH", path, {"status": "planned"}, ifMatch=etag
        )
        self.assertEqual(code, 200)
        code, _, _ = await self.request(
            "PATCH", path, {"status": "active"}, ifMatch=etag
        )
        self.assertEqual(code, 412)
        self.assertEqual(self.fake.devices[ident]["status"], "planned")
        self.assertEqual(newer, self.fake.etag(ident))

    async def test_withoutETags_noHeaderIfMatchIgnored(self) -> None:
        """
        C{etags} off, as NetBox before 4.6 (or a proxy stripping the
        header) answers: no ETag on details or PATCHes, and an If-Match
        that no longer matches is ignored (the write lands).
        """
        self.fake.etags = False
        ident = self.fake.addDevice("w1", "S1")
        path = f"api/dcim/devices/{ident}/"
        _, _, etag = await self.request("GET", path)
        self.assertIsNone(etag)
        code, _, etag = await self.request(
            "PATCH", path, {"status": "planned"}, ifMatch='W/"stale"'
        )
        self.assertEqual((code, etag), (200, None))
        self.assertEqual(self.fake.devices[ident]["status"], "planned")

    async def test_patch_validation(self) -> None:
        """400 names the field: unknown custom field, bad status, mistyped text."""
        ident = self.fake.addDevice("w1", "S1")
        path = f"api/dcim/devices/{ident}/"
        for body, field, words in (
            ({"custom_fields": {"nope": 1}}, "custom_fields", "Unknown field name"),
            ({"status": "exploded"}, "status", "not a valid choice"),
            (
                {"custom_fields": {"fleetd_uuid": 7}},
                "custom_fields",
                "must be a string",
            ),
        ):
            code, doc, _ = await self.request("PATCH", path, body)
            self.assertEqual(code, 400)
            self.assertIn(words, doc[field][0])
        self.assertEqual(self.fake.devices[ident]["status"], "inventory")

    async def test_patch_mergesCustomFields(self) -> None:
        """PATCH only needs the changed fields; custom fields are merged."""
        ident = self.fake.addDevice("w1", "S1", uuid=UUID, deviceClass="worker-g3")
        path = f"api/dcim/devices/{ident}/"
        code, doc, _ = await self.request(
            "PATCH", path, {"custom_fields": {"fleetd_release": {"run": "r-1"}}}
        )
        self.assertEqual(code, 200)
        fields = doc["custom_fields"]
        self.assertEqual(
            (fields["fleetd_uuid"], fields["fleetd_release"]), (UUID, {"run": "r-1"})
        )

    async def test_trailingSlashRequired(self) -> None:
        """Detail endpoints need their trailing slash."""
        ident = self.fake.addDevice("w1", "S1")
        code, _, _ = await self.request("GET", f"api/dcim/devices/{ident}")
        self.assertEqual(code, 404)

    async def test_auth(self) -> None:
        """No token or an unknown one is 403; v1 is 'Token', v2 (nbt_) 'Bearer'."""
        self.fake.tokens[V1] = False
        self.assertEqual(
            (await self.request("GET", "api/dcim/devices/", token=None))[0], 403
        )
        self.assertEqual(
            (await self.request("GET", "api/dcim/devices/", token="nbt_x.y"))[0], 403
        )
        self.assertEqual(
            (await self.request("GET", "api/dcim/devices/", token=V1))[0], 200
        )
        ident = self.fake.addDevice("w1", "S1")
        code, doc, _ = await self.request(
            "PATCH", f"api/dcim/devices/{ident}/", {"status": "active"}, token=V1
        )
        self.assertEqual(code, 403)  # write disabled on that token
        self.assertIn("permission", doc["detail"])

    async def test_journal(self) -> None:
        """
        Journal entries: kind defaults to info, the object must exist (400),
        q is a substring search of the comments.
        """
        ident = self.fake.addDevice("w1", "S1")
        code, entry, _ = await self.request(
            "POST",
            "api/extras/journal-entries/",
            {
                "assigned_object_type": "dcim.device",
                "assigned_object_id": ident,
                "comments": "x\nfleetd-entry: 12-ab",
            },
        )
        self.assertEqual((code, entry["kind"]["value"]), (201, "info"))
        code, doc, _ = await self.request(
            "POST",
            "api/extras/journal-entries/",
            {
                "assigned_object_type": "dcim.device",
                "assigned_object_id": 999,
                "comments": "x",
            },
        )
        self.assertEqual(code, 400)
        self.assertIn("assigned_object_id", doc)
        _, found, _ = await self.request(
            "GET", "api/extras/journal-entries/?q=fleetd-entry%3A%201"
        )
        self.assertEqual(found["count"], 1)  # "1" is a substring of "12"

    async def test_customFields_byObjectType(self) -> None:
        """Custom fields list their object types and type."""
        _, page, _ = await self.request(
            "GET", "api/extras/custom-fields/?object_type=dcim.device"
        )
        kinds = {f["name"]: f["type"]["value"] for f in page["results"]}
        self.assertEqual(
            kinds,
            {"fleetd_uuid": "text", "fleetd_class": "text", "fleetd_release": "json"},
        )


def _headers(
    token: str | None, ifMatch: str | None, body: object
) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {"Accept": ["application/json"]}
    if token is not None:
        headers["Authorization"] = [authorization(token)]
    if ifMatch is not None:
        headers["If-Match"] = [ifMatch]
    if body is not None:
        headers["Content-Type"] = ["application/json"]
    return headers


class StubFakeContractTests(NetBoxAPIContractMixin, TestCase):
    """The contract against the fake, in memory (StubTreq)."""

    def setUp(self) -> None:
        self.fake = FakeNetBox(basePath=self.base)
        self.http = StubTreq(self.fake)

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        token: str | None = TOKEN,
        ifMatch: str | None = None,
    ) -> tuple[int, Any, str | None]:
        response = await self.http.request(  # type: ignore[attr-defined]
            method,
            "http://netbox.example" + self.base + path,
            headers=_headers(token, ifMatch, body),
            data=None if body is None else json.dumps(body).encode(),
        )
        content = await treq.content(response)
        etag = (response.headers.getRawHeaders("etag") or [None])[0]
        return response.code, json.loads(content), etag


class LoopbackFakeContractTests(NetBoxAPIContractMixin, TestCase):
    """
    The contract over real loopback HTTPS: the fake behind a TLS port,
    the client built by L{makeClient} trusting only C{[netbox] ca}.
    """

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        directory = Path(self.mktemp())
        pki = ensureDevPKI(directory / "pki", "netbox.example")
        self.fake = FakeNetBox(basePath=self.base)
        cert = PrivateCertificate.loadPEM(
            pki.public_cert.read_bytes() + pki.public_key.read_bytes()
        )
        endpoint = SSL4ServerEndpoint(reactor, 0, cert.options(), interface="127.0.0.1")
        tokenFile = directory / "token"
        tokenFile.write_text(TOKEN + "\n")
        self.tokenFile = tokenFile
        self.ca = pki.public_ca

        def listening(port: Any) -> None:
            self.addCleanup(port.stopListening)
            self.url = f"https://localhost:{port.getHost().port}{self.base}"
            self.client = makeClient(
                fleetdReactor(reactor), self.url, tokenFile, self.ca, timeout=10
            )
            self.addCleanup(self.client.close)

        d: Deferred[None] = endpoint.listen(Site(self.fake)).addCallback(listening)
        return d

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        token: str | None = TOKEN,
        ifMatch: str | None = None,
    ) -> tuple[int, Any, str | None]:
        client = self.client
        if token != TOKEN:
            other = self.tokenFile.with_name("other")
            other.write_text(token or "x")
            client = makeClient(
                fleetdReactor(reactor), self.url, other, self.ca, timeout=10
            )
            if token is None:  # no header at all
                client._auth = ""
        try:
            doc, etag = await client.call(method, client.url(path), body, ifMatch)
            return (201 if method == "POST" else 200), doc, etag
        except NetBoxError as e:
            code = {"forbidden": 403, "invalid": 400, "not-found": 404, "conflict": 412}
            return code[e.kind], _fieldsOf(e), None
        finally:
            if client is not self.client:
                await client.close()


def _fieldsOf(error: NetBoxError) -> dict[str, Any]:
    """The client reports an error as one line; shape it as the checks read it."""
    text = str(error)
    fields: dict[str, Any] = {
        key: [text] for key in ("status", "custom_fields", "assigned_object_id")
    }
    fields["detail"] = text
    return fields


class ClientSetupTests(SynchronousTestCase):
    """The token's scheme, the URL, and bad [netbox] files."""

    def test_authorization_byTokenForm(self) -> None:
        """v2 tokens (nbt_) go as Bearer, v1 tokens as Token; blanks are refused."""
        self.assertEqual(authorization("nbt_k.t\n"), "Bearer nbt_k.t")
        self.assertEqual(authorization(V1), f"Token {V1}")
        for bad in ("", "a b", "\n"):
            self.assertRaises(ValueError, authorization, bad)

    def test_url_basePath(self) -> None:
        """The URL may carry a base path; calls go below it."""
        http: Any = StubTreq(FakeNetBox())
        client = NetBoxClient(http, reactor, "http://h/nb", TOKEN)
        self.assertEqual(
            client.url("api/dcim/devices/"), "http://h/nb/api/dcim/devices/"
        )
        self.assertRaises(ValueError, checkURL, "ftp://h/")

    def test_badFiles_nameTheKey(self) -> None:
        """An unreadable token file or a CA file without a certificate names its key."""
        directory = Path(self.mktemp())
        directory.mkdir()
        (directory / "ca.pem").write_text("not a certificate")
        (directory / "token").write_text(TOKEN)
        e = self.assertRaises(
            NetBoxSetupError,
            makeClient,
            reactor,
            "https://h/",
            directory / "nope",
            None,
        )
        self.assertEqual(e.key, "netbox.token_file")
        e = self.assertRaises(
            NetBoxSetupError,
            makeClient,
            reactor,
            "https://h/",
            directory / "token",
            directory / "ca.pem",
        )
        self.assertEqual(e.key, "netbox.ca")
