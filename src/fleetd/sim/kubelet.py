"""
The cluster a rack joins: the strict Kubernetes fake (L{fleetd.testing.kube})
served over TLS on loopback with the dev PKI's public certificate (it
covers 127.0.0.1), which fleetd's C{[kubernetes]} names; and a
kubelet-like client that files a node's first client CSR with the
bootstrap token its delivered configuration carries, then polls the CSR
until it is approved (fleetd's approver watches the fake [K2]).

The client is blocking (http.client): the rack runs it in a thread. A
token is a secret that joins a node: it is used, never kept or printed.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from twisted.internet.interfaces import IListeningPort
from twisted.internet.ssl import PrivateCertificate
from twisted.web.server import Site

from fleetd.pki.dev import DevPKIPaths
from fleetd.testing.kube import FakeKube, csrPEM

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"


def serveFake(reactor: Any, pki: DevPKIPaths) -> tuple[FakeKube, IListeningPort]:
    """The fake API on a free loopback TLS port, with the dev public leaf."""
    fake = FakeKube(reactor)
    pem = pki.public_cert.read_bytes() + pki.public_key.read_bytes()
    options = PrivateCertificate.loadPEM(pem).options()
    port: IListeningPort = reactor.listenSSL(
        0, Site(fake.resource()), options, interface="127.0.0.1"
    )
    return fake, port


def bootstrapToken(config: bytes) -> str:
    """C{cluster.token} of a delivered Talos machine configuration."""
    document = yaml.safe_load(config)
    token = (document.get("cluster") or {}).get("token")
    if not isinstance(token, str):
        raise ValueError("the configuration carries no cluster.token")
    return token


class _API:
    """Requests to the fake as one kubelet makes them."""

    def __init__(self, port: int, ca: Path, token: str, source: str) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=str(ca))
        self.headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        }
        self.source = source

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection(
            "127.0.0.1",
            self.port,
            context=self.context,
            timeout=30,
            source_address=(self.source, 0),
        )
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=self.headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()


def fileCSR(*, port: int, ca: Path, token: str, node: str, source: str) -> str:
    """
    File a kubelet client CSR for C{node} (CN C{system:node:NODE}, O
    C{system:nodes}) authenticated by C{token} (a bootstrap token, or the
    bearer standing for a kubelet's client certificate); its name.
    """
    api = _API(port, ca, token, source)
    return _file(api, node)


def registerNode(*, port: int, ca: Path, token: str, node: str, source: str) -> None:
    """Register the Node C{node}, as a kubelet does once it has its
    client certificate (C{token}: the bearer standing for it)."""
    status, _ = _API(port, ca, token, source).call(
        "POST",
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
    )
    if status != 201:
        raise RuntimeError(f"Node {node} not registered: HTTP {status}")


def _file(api: _API, node: str) -> str:
    pem = csrPEM(f"system:node:{node}")
    status, created = api.call(
        "POST",
        CSRS,
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"generateName": "csr-"},
            "spec": {
                "request": base64.b64encode(pem).decode("ascii"),
                "signerName": SIGNER,
                "usages": ["digital signature", "client auth"],
            },
        },
    )
    if status != 201:
        raise RuntimeError(f"CSR refused: HTTP {status}")
    return str(created["metadata"]["name"])


def fileAndAwait(
    *,
    port: int,
    ca: Path,
    token: str,
    node: str,
    source: str,
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """
    File C{node}'s kubelet client CSR (CN C{system:node:NODE}, O
    C{system:nodes}) authenticated by C{token}, and poll it until a
    condition says C{Approved} or C{Denied}, or C{timeout} seconds pass;
    that condition's type, or C{"pending"}.
    """
    api = _API(port, ca, token, source)
    name = _file(api, node)
    deadline = clock() + timeout
    while clock() < deadline:
        status, csr = api.call("GET", f"{CSRS}/{name}")
        if status != 200:
            raise RuntimeError(f"CSR {name}: HTTP {status}")
        for condition in (csr.get("status") or {}).get("conditions") or []:
            if condition.get("type") in ("Approved", "Denied"):
                return str(condition["type"])
        sleep(0.2)
    return "pending"
