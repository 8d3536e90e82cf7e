"""
A reader on a real daemon [O4]: reader certificates from the dev PKI's
owner CA, HTTPS requests with them, and every route of the admin
listener that takes a change, found in the code.

L{changeRoutes} and L{staticChanges} find the routes: every resource
class of C{fleetd.admin} that answers a method other than GET and HEAD
(or answers every method itself), and every path of the daemon's tree
that leads to one. The tests hold each against a table of sample
requests, so an endpoint added without a row fails them.
"""

from __future__ import annotations

import http.client
import importlib
import json
import pkgutil
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from twisted.internet.protocol import Factory
from twisted.web import resource
from twisted.web.server import Site
from twisted.web.test.requesthelper import DummyRequest

import fleetd.admin
from fleetd.admin.console.gate import Guarded
from fleetd.admin.resource import OwnerGate
from fleetd.pki.dev import DevPKIPaths
from fleetd.pki.owners import READER, rolePolicies
from fleetd.service import FleetdService
from tests.ownersupport import issue

READS = frozenset({"GET", "HEAD"})
Pair = tuple[Path, Path]


def reader(pki: DevPKIPaths, name: str) -> Pair:
    """A reader's certificate and key for C{name}, from the owner CA [O4]."""
    _, cert, key = issue(pki, name, extensions=[rolePolicies(READER)])
    return cert, key


def request(
    port: int,
    method: str,
    path: str,
    ca: Path,
    pair: Pair | None,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTPS request to the admin listener: status, headers, body."""
    context = ssl.create_default_context(cafile=str(ca))
    if pair is not None:
        context.load_cert_chain(str(pair[0]), str(pair[1]))
    conn = http.client.HTTPSConnection("localhost", port, timeout=20, context=context)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        got = {k.lower(): v for k, v in response.getheaders()}
        return response.status, got, response.read()
    finally:
        conn.close()


def adminRoot(service: FleetdService) -> resource.Resource:
    """The resource tree the daemon's admin listener serves."""
    factory: Any = service.listeners["admin"].factory
    while not isinstance(factory, Site):
        factory = factory.wrappedFactory
        assert isinstance(factory, Factory), factory
    root: resource.Resource = factory.resource
    return root


def _inner(found: resource.Resource) -> resource.Resource:
    """Past the gates: what an admitted request meets."""
    while isinstance(found, OwnerGate | Guarded):
        found = found.inner
    return found


def landed(root: resource.Resource, method: str, path: str) -> resource.Resource:
    """
    The resource C{method path} reaches as twisted.web traverses the tree,
    past the owner and console gates (as an admitted owner's request).
    """
    segments = path.lstrip("/").split("/")
    fake = DummyRequest([s.encode() for s in segments])
    fake.method = method.encode()
    found = _inner(root)
    while fake.postpath and not found.isLeaf:
        segment = fake.postpath.pop(0)
        fake.prepath.append(segment)
        found = _inner(found.getChildWithDefault(segment, fake))
    return found


def _changes(cls: type[resource.Resource]) -> set[str]:
    """The methods other than GET and HEAD that C{cls} itself answers."""
    return {
        name[len("render_") :]
        for name in vars(cls)
        if name.startswith("render_") and name[len("render_") :] not in READS
    }


def _subclasses(cls: type[Any]) -> Iterator[type[Any]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def changeRoutes() -> dict[type[resource.Resource], set[str]]:
    """
    Every resource class of C{fleetd.admin} (the API and the console) that
    answers a change itself (a C{render_POST}, C{render_PUT}, ...) with its
    methods, and those that answer every method in C{render} (an empty
    set): all of them, imported from every module of the package.
    """
    for module in pkgutil.walk_packages(fleetd.admin.__path__, "fleetd.admin."):
        importlib.import_module(module.name)
    found: dict[type[resource.Resource], set[str]] = {}
    for cls in set(_subclasses(resource.Resource)):
        if not cls.__module__.startswith("fleetd.admin."):
            continue
        methods = _changes(cls)
        if methods or "render" in vars(cls):
            found[cls] = methods
    return found


def staticChanges(root: resource.Resource) -> dict[str, resource.Resource]:
    """
    Every path of the tree's fixed children (C{putChild}, past the gates)
    whose resource answers a method other than GET and HEAD.
    """
    found: dict[str, resource.Resource] = {}

    def walk(path: str, here: resource.Resource) -> None:
        here = _inner(here)
        methods = {
            name[len("render_") :]
            for name in dir(here)
            if name.startswith("render_") and name[len("render_") :] not in READS
        }
        if methods:
            found[path or "/"] = here
        for name, child in here.children.items():
            walk(f"{path}/{name.decode()}", child)

    walk("", root)
    return found


def jsonBody(document: Any) -> tuple[bytes, str]:
    """A JSON body and its type."""
    return json.dumps(document).encode(), "application/json"
