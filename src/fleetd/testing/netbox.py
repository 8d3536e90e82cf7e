"""
A strict in-process fake of the NetBox REST API (v4.6), for tests.

It models what fleetd relies on, as notes/kube-netbox.md section 6 and the
NetBox source (v4.6.8) document it:

  - authentication: C{Authorization: Bearer nbt_<key>.<token>} (v2) or
    C{Token <token>} (v1), the version told by the C{nbt_} prefix
    (C{netbox/api/authentication.py}); a missing or unknown token is 403,
    a write with a token whose "write enabled" is off is 403;
  - lists (C{count}, C{next}, C{previous}, C{results}) paged by C{limit}
    and C{offset}, default page C{PAGINATE_COUNT} = 50, capped at
    C{MAX_PAGE_SIZE} = 1000; C{next} is an absolute URL;
  - filters as NetBox declares them: devices by C{id}, C{name} (exact),
    C{name__ie} (iexact), C{serial} (C{MultiValueCharFilter} with
    C{lookup_expr='iexact'}, C{dcim/filtersets.py}); interfaces by
    C{device_id}; custom fields by C{object_type}; journal entries by
    C{assigned_object_type}, C{assigned_object_id} and C{q} (a substring
    search of the comments, case-insensitive). Unknown filters are
    ignored, as django-filter does;
  - a device's C{primary_ip4}, C{primary_ip6} and the read-only
    C{primary_ip} (C{primary_ip6} first unless C{PREFER_IPV4}, as
    C{Device.primary_ip} in C{dcim/models/devices.py}), each an IP address
    nested as C{DeviceSerializer} nests it (the brief fields C{id},
    C{url}, C{display}, C{family}, C{address}, C{description}, and
    C{dns_name}, C{nat_inside}, C{nat_outside}; the address with its
    prefix length);
  - detail endpoints with a trailing slash only; a weak C{ETag} on device
    details, and 412 for a PATCH whose C{If-Match} no longer matches
    (NetBox 4.6);
  - PATCH merges C{custom_fields} into the stored data; an unknown custom
    field name or a wrongly typed value is a 400 naming it
    (C{extras/api/customfields.py}); a status outside the choices is a 400
    (C{DeviceStatusChoices}, extendable per site);
  - journal entries: C{kind} defaults to C{info}, must be one of
    info/success/warning/danger, and the assigned object must exist, or
    400 (C{extras/api/serializers_/journaling.py}).

Fault switches: C{etags} off (NetBox before 4.6, or a proxy that strips
the header: no C{ETag} on any answer, C{If-Match} ignored as Django REST
framework ignores it there), C{hang} (no request is ever answered), C{swallowWrites}
(the next N writes are applied, then never answered: a timeout whose
request landed), C{beforePatch} (an operator's edit between fleetd's read
and its PATCH). C{requests} records every request's method and path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

STATUSES = [
    "offline",
    "active",
    "planned",
    "staged",
    "failed",
    "inventory",
    "decommissioning",
]
KINDS = ("info", "success", "warning", "danger")
PAGINATE_COUNT = 50
MAX_PAGE_SIZE = 1000
FLEETD_FIELDS = {
    "fleetd_uuid": "text",
    "fleetd_class": "text",
    "fleetd_release": "json",
}


class _Answer(Exception):
    def __init__(self, code: int, body: object) -> None:
        self.code = code
        self.body = body


class FakeNetBox(Resource):
    """NetBox's REST API in memory; serve it with C{StubTreq} or a real port."""

    isLeaf = True

    def __init__(
        self,
        tokens: dict[str, bool] | None = None,
        basePath: str = "/",
        customFields: dict[str, str] | None = None,
    ) -> None:
        """
        @param tokens: token -> write enabled.
        @param basePath: where NetBox is mounted (C{BASE_PATH}).
        @param customFields: name -> type of custom fields on C{dcim.device}
            (default: fleetd's three).
        """
        super().__init__()  # type: ignore[no-untyped-call]
        self.tokens = {"nbt_fleetd01.s3cret": True} if tokens is None else dict(tokens)
        self.basePath = basePath if basePath.endswith("/") else basePath + "/"
        self.customFields = dict(
            FLEETD_FIELDS if customFields is None else customFields
        )
        self.statuses = list(STATUSES)
        self.devices: dict[int, dict[str, Any]] = {}
        self.interfaces: dict[int, dict[str, Any]] = {}
        self.addresses: dict[int, dict[str, Any]] = {}
        self.preferIPv4 = False  # NetBox's PREFER_IPV4 (default False)
        self.journal: dict[int, dict[str, Any]] = {}
        self.versions: dict[int, int] = {}
        self._ids = 0
        self.hang = False
        self.etags = True
        self.swallowWrites = 0
        self.beforePatch: Callable[[int], None] | None = None
        self.requests: list[tuple[str, str]] = []
        self.ifMatches: list[str | None] = []
        self.maxPageSize = MAX_PAGE_SIZE
        self.hung: list[Request] = []

    # Test helpers (what an operator does in NetBox's UI)

    def _id(self) -> int:
        self._ids += 1
        return self._ids

    def addDevice(
        self,
        name: str,
        serial: str = "",
        *,
        status: str = "inventory",
        uuid: str | None = None,
        deviceClass: str | None = None,
        cluster: str | None = None,
        macs: tuple[tuple[str, str | None, bool], ...] = (),
        primary: tuple[str, ...] = (),
    ) -> int:
        """
        Add a device; C{macs} are (interface, MAC or None, mgmt_only);
        C{primary} its primary IP addresses (with their prefix length, at
        most one per family, L{setPrimaryIP}).
        """
        ident = self._id()
        fields: dict[str, Any] = {name: None for name in self.customFields}
        if uuid is not None:
            fields["fleetd_uuid"] = uuid
        if deviceClass is not None:
            fields["fleetd_class"] = deviceClass
        self.devices[ident] = {
            "id": ident,
            "name": name,
            "serial": serial,
            "status": status,
            "cluster": None if cluster is None else {"id": 1, "name": cluster},
            "custom_fields": fields,
            "primary_ip4": None,
            "primary_ip6": None,
        }
        self.versions[ident] = 1
        for address in primary:
            self.setPrimaryIP(ident, address)
        for interface, mac, mgmt in macs:
            iid = self._id()
            self.interfaces[iid] = {
                "id": iid,
                "device": {"id": ident, "name": name},
                "name": interface,
                "mgmt_only": mgmt,
                "mac_address": mac,
            }
        return ident

    def setPrimaryIP(self, ident: int, address: str | None, family: int = 4) -> None:
        """
        An operator's edit: a new IP address object (C{"10.0.0.5/24"})
        made the device's primary of its family, or (L{None}) the primary
        of C{family} cleared.
        """
        iid: int | None = None
        if address is not None:
            family = 6 if ":" in address else 4
            iid = self._id()
            self.addresses[iid] = {"id": iid, "family": family, "address": address}
        self.edit(ident, **{f"primary_ip{family}": iid})

    def edit(self, ident: int, **changes: Any) -> None:
        """An operator's edit: the device's ETag changes."""
        device = self.devices[ident]
        for key, value in changes.items():
            if key == "custom_fields":
                device["custom_fields"].update(value)
            else:
                device[key] = value
        self.versions[ident] += 1

    def byName(self, name: str) -> dict[str, Any]:
        (device,) = [d for d in self.devices.values() if d["name"] == name]
        return device

    def etag(self, ident: int) -> str:
        return f'W/"{ident}-{self.versions[ident]}"'

    # Serialisation

    def _ip(self, iid: int | None) -> dict[str, Any] | None:
        if iid is None:
            return None
        ip = self.addresses[iid]
        return {
            "id": iid,
            "url": f"{self.basePath}api/ipam/ip-addresses/{iid}/",
            "display": ip["address"],
            "family": {"value": ip["family"], "label": f"IPv{ip['family']}"},
            "address": ip["address"],
            "description": "",
            "dns_name": "",
            "nat_inside": None,
            "nat_outside": [],
        }

    def _device(self, d: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.basePath}api/dcim/devices/{d['id']}/"
        v4, v6 = d["primary_ip4"], d["primary_ip6"]
        preferred = v4 if self.preferIPv4 and v4 is not None else v6 or v4
        return {
            "id": d["id"],
            "url": url,
            "display": d["name"],
            "name": d["name"],
            "serial": d["serial"],
            "status": {"value": d["status"], "label": d["status"].title()},
            "primary_ip": self._ip(preferred),
            "primary_ip4": self._ip(v4),
            "primary_ip6": self._ip(v6),
            "cluster": d["cluster"],
            "custom_fields": dict(d["custom_fields"]),
        }

    # HTTP

    def render(self, request: Request) -> bytes | int:
        path = request.path.decode("ascii", "replace")
        method = request.method.decode("ascii")
        self.requests.append((method, path))
        if self.hang:
            self.hung.append(request)
            return NOT_DONE_YET
        try:
            code, body, etag = self._dispatch(request, method, path)
        except _Answer as answer:
            code, body, etag = answer.code, answer.body, None
        if method != "GET" and self.swallowWrites and 200 <= code < 300:
            self.swallowWrites -= 1
            self.hung.append(request)
            return NOT_DONE_YET
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        if etag is not None and self.etags:
            request.setHeader(b"etag", etag.encode("ascii"))
        return json.dumps(body).encode("utf-8")

    def _auth(self, request: Request, write: bool) -> None:
        header = (request.getHeader(b"authorization") or b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if not header:
            raise _Answer(
                403, {"detail": "Authentication credentials were not provided."}
            )
        expected = "Bearer" if token.startswith("nbt_") else "Token"
        if scheme != expected or token not in self.tokens:
            version = "v2" if token.startswith("nbt_") else "v1"
            raise _Answer(403, {"detail": f"Invalid {version} token"})
        if write and not self.tokens[token]:
            raise _Answer(
                403, {"detail": "You do not have permission to perform this action."}
            )

    def _dispatch(
        self, request: Request, method: str, path: str
    ) -> tuple[int, object, str | None]:
        if not path.startswith(self.basePath + "api/"):
            raise _Answer(404, {"detail": "Not found."})
        self._auth(request, write=method not in ("GET", "HEAD", "OPTIONS"))
        route = path[len(self.basePath) :]
        query = {k.decode(): [v.decode() for v in vs] for k, vs in request.args.items()}
        if route == "api/dcim/devices/" and method == "GET":
            return self._list(request, route, query, self._devices(query))
        if route.startswith("api/dcim/devices/") and route.count("/") == 4:
            ident = route.split("/")[3]
            if not ident.isdigit() or int(ident) not in self.devices:
                raise _Answer(404, {"detail": "No Device matches the given query."})
            if method == "GET":
                device = self.devices[int(ident)]
                return 200, self._device(device), self.etag(int(ident))
            if method == "PATCH":
                return self._patch(request, int(ident))
            raise _Answer(405, {"detail": f'Method "{method}" not allowed.'})
        if route == "api/dcim/interfaces/" and method == "GET":
            items = sorted(self.interfaces.values(), key=lambda i: i["id"])
            if "device_id" in query:
                wanted = {int(v) for v in query["device_id"] if v.isdigit()}
                items = [i for i in items if i["device"]["id"] in wanted]
            return self._list(request, route, query, items)
        if route == "api/extras/custom-fields/" and method == "GET":
            items = [
                {
                    "id": n,
                    "name": name,
                    "object_types": ["dcim.device"],
                    "type": {"value": kind, "label": kind.title()},
                }
                for n, (name, kind) in enumerate(sorted(self.customFields.items()), 1)
            ]
            if "object_type" in query:
                items = [
                    i for i in items if query["object_type"][0] in i["object_types"]
                ]
            return self._list(request, route, query, items)
        if route == "api/extras/journal-entries/":
            if method == "GET":
                return self._list(request, route, query, self._entries(query))
            if method == "POST":
                return self._post(request)
        raise _Answer(404, {"detail": "Not found."})

    def _devices(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        items = sorted(self.devices.values(), key=lambda d: (d["name"], d["id"]))
        if "id" in query:
            items = [d for d in items if str(d["id"]) in query["id"]]
        if "name" in query:
            items = [d for d in items if d["name"] in query["name"]]
        if "name__ie" in query:
            wanted = {v.lower() for v in query["name__ie"]}
            items = [d for d in items if d["name"].lower() in wanted]
        if "serial" in query:
            wanted = {v.lower() for v in query["serial"]}
            items = [d for d in items if d["serial"].lower() in wanted]
        return [self._device(d) for d in items]

    def _entries(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        items = sorted(self.journal.values(), key=lambda e: -e["id"])
        if "assigned_object_type" in query:
            items = [
                e
                for e in items
                if e["assigned_object_type"] in query["assigned_object_type"]
            ]
        if "assigned_object_id" in query:
            items = [
                e
                for e in items
                if str(e["assigned_object_id"]) in query["assigned_object_id"]
            ]
        if "q" in query:
            needle = query["q"][0].strip().lower()
            items = [e for e in items if needle in e["comments"].lower()]
        return items

    def _list(
        self,
        request: Request,
        route: str,
        query: dict[str, list[str]],
        items: list[dict[str, Any]],
    ) -> tuple[int, object, str | None]:
        try:
            limit = int(query.get("limit", [str(PAGINATE_COUNT)])[0])
            offset = int(query.get("offset", ["0"])[0])
        except ValueError:
            raise _Answer(400, {"detail": "Invalid limit or offset."}) from None
        if limit <= 0 or limit > self.maxPageSize:
            limit = self.maxPageSize
        offset = max(offset, 0)
        page = items[offset : offset + limit]
        host = (request.getHeader(b"host") or b"netbox").decode("ascii")
        scheme = "https" if request.isSecure() else "http"

        def link(at: int) -> str:
            params = {k: v for k, v in query.items() if k not in ("limit", "offset")}
            params["limit"] = [str(limit)]
            params["offset"] = [str(at)]
            return f"{scheme}://{host}{self.basePath}{route}?" + urlencode(
                sorted(params.items()), doseq=True
            )

        return (
            200,
            {
                "count": len(items),
                "next": link(offset + limit) if offset + limit < len(items) else None,
                "previous": link(max(offset - limit, 0)) if offset > 0 else None,
                "results": page,
            },
            None,
        )

    def _body(self, request: Request) -> dict[str, Any]:
        assert request.content is not None
        try:
            body = json.loads(request.content.read() or b"null")
        except ValueError:
            raise _Answer(400, {"detail": "JSON parse error"}) from None
        if not isinstance(body, dict):
            raise _Answer(
                400,
                {
                    "non_field_errors": [
                        "Invalid data. Expected a dictionary, but got"
                        f" {type(body).__name__}."
                    ]
                },
            )
        return body

    def _patch(self, request: Request, ident: int) -> tuple[int, object, str | None]:
        body = self._body(request)
        if self.beforePatch is not None:
            self.beforePatch(ident)
        match = request.getHeader(b"if-match")
        self.ifMatches.append(None if match is None else match.decode("latin-1"))
        if (
            self.etags
            and match is not None
            and match.decode("latin-1") != self.etag(ident)
        ):
            raise _Answer(412, {"detail": "Precondition failed."})
        device = self.devices[ident]
        errors: dict[str, list[str]] = {}
        if "status" in body and body["status"] not in self.statuses:
            errors["status"] = [f'"{body["status"]}" is not a valid choice.']
        fields = body.get("custom_fields", {})
        if not isinstance(fields, dict):
            errors["custom_fields"] = ["Invalid data. Expected a dictionary."]
            fields = {}
        for name, value in fields.items():
            if name not in self.customFields:
                errors["custom_fields"] = [
                    f"Unknown field name '{name}' in custom field data."
                ]
            elif self.customFields[name] == "text" and not (
                value is None or isinstance(value, str)
            ):
                errors["custom_fields"] = [
                    f"Invalid value for custom field '{name}': Value must be a string."
                ]
        if errors:
            raise _Answer(400, errors)
        for key in ("status", "name", "serial"):
            if key in body:
                device[key] = body[key]
        device["custom_fields"].update(fields)
        self.versions[ident] += 1
        return 200, self._device(device), self.etag(ident)

    def _post(self, request: Request) -> tuple[int, object, str | None]:
        body = self._body(request)
        errors: dict[str, list[str]] = {}
        kind = body.get("kind", "info")
        if kind not in KINDS:
            errors["kind"] = [f'"{kind}" is not a valid choice.']
        if body.get("assigned_object_type") != "dcim.device":
            errors["assigned_object_type"] = ["Invalid object type."]
        target = body.get("assigned_object_id")
        if not isinstance(target, int) or target not in self.devices:
            errors["assigned_object_id"] = [f"Invalid assigned_object_id: {target!r}"]
        if not isinstance(body.get("comments"), str) or not body["comments"]:
            errors["comments"] = ["This field is required."]
        if errors:
            raise _Answer(400, errors)
        ident = self._id()
        entry = {
            "id": ident,
            "assigned_object_type": "dcim.device",
            "assigned_object_id": target,
            "kind": {"value": kind, "label": kind.title()},
            "comments": body["comments"],
        }
        self.journal[ident] = entry
        return 201, entry, None
