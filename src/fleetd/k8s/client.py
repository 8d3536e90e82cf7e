"""
A small Kubernetes API client on treq: exactly the calls fleetd makes.

Secrets in C{kube-system}, CertificateSigningRequests (list, watch, the
approval subresource), Nodes and ClusterRoleBindings (read), Tinkerbell
Workflows (list, watch). Every call
has a deadline on the injected clock. Failures are L{KubeError}s whose
subclass says what the caller may do: L{KubeUnavailable} (connection
refused, timeout, 5xx, 429: retry later), L{Conflict} (409: read again),
L{Gone} (410: list again), L{NotFound} (404), others final.

The bearer token file is read once per client; the CA and client
certificate are loaded by L{agentFromSettings}.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.error import ConnectError, ConnectionLost, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.client import ResponseFailed
from twisted.web.iweb import IResponse

from fleetd.config import KubernetesSettings
from fleetd.k8s.errors import (
    Conflict,
    Gone,
    Invalid,
    KubeError,
    KubeUnavailable,
    NotFound,
    errorFor,
)
from fleetd.k8s.stream import BodyCollector, Watch

__all__ = [
    "Conflict",
    "Gone",
    "Invalid",
    "KubeClient",
    "KubeError",
    "KubeUnavailable",
    "NotFound",
    "Watch",
]

NAMESPACE = "kube-system"
SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
NODES = "/api/v1/nodes"
BINDINGS = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
NAMESPACED_BINDINGS = "/apis/rbac.authorization.k8s.io/v1/rolebindings"
NAMESPACED_ROLES = "/apis/rbac.authorization.k8s.io/v1/roles"
KUBELET_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
WORKFLOWS = "/apis/tinkerbell.org/v1alpha1"
APPROVE_ATTEMPTS = 5


_UNREACHABLE = (
    ConnectError,
    DNSLookupError,
    ConnectionLost,
    ResponseFailed,
    TimeoutError,
    CancelledError,
    OSError,
)


def workflowsPath(namespace: str | None) -> str:
    """The Workflow collection in C{namespace}, or in all namespaces."""
    if namespace is None:
        return f"{WORKFLOWS}/workflows"
    return f"{WORKFLOWS}/namespaces/{quote(namespace)}/workflows"


class IHTTP(Protocol):
    """The part of C{treq.client.HTTPClient} (or C{StubTreq}) fleetd uses."""

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[IResponse]:
        "Send one request."


class KubeClient:
    """
    The calls fleetd makes to one cluster's API server.

    @param api: the API server's base URL (C{https://host:6443}).
    @param http: a treq C{HTTPClient} (or C{StubTreq} in tests).
    @param bearer: the bearer token, or L{None} with a client certificate.
    """

    log = Logger()

    def __init__(
        self,
        api: str,
        http: Any,
        clock: IReactorTime,
        *,
        bearer: str | None = None,
        timeout: float = KubernetesSettings.timeout,
        pool: Any = None,
    ) -> None:
        self._pool = pool
        self.api = api.rstrip("/")
        self._http = http
        self._clock = clock
        self._bearer = bearer
        self.timeout = timeout
        self._inflight: set[Deferred[tuple[int, bytes]]] = set()

    def _headers(self, json_: bool = False) -> dict[bytes, list[bytes]]:
        headers = {b"accept": [b"application/json"]}
        if json_:
            headers[b"content-type"] = [b"application/json"]
        if self._bearer is not None:
            headers[b"authorization"] = [b"Bearer " + self._bearer.encode("ascii")]
        return headers

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
    ) -> Any:
        url = self.api + path + ("?" + urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        d = self._http.request(
            method, url, headers=self._headers(data is not None), data=data
        )

        async def exchange() -> tuple[int, bytes]:
            response: IResponse = await d
            chunks: list[bytes] = []
            done: Deferred[None] = Deferred()
            response.deliverBody(BodyCollector(chunks, done))
            await done
            return response.code, b"".join(chunks)

        whole = Deferred.fromCoroutine(exchange())
        whole.addTimeout(self.timeout, self._clock)
        self._inflight.add(whole)
        try:
            code, raw = await whole
        except KubeError:
            raise
        except _UNREACHABLE as e:
            raise KubeUnavailable(
                f"{what}: API unreachable: {e.__class__.__name__}"
            ) from e
        finally:
            self._inflight.discard(whole)
        if not 200 <= code < 300:
            raise errorFor(code, raw, what)
        try:
            return json.loads(raw) if raw else {}
        except ValueError as e:
            raise KubeUnavailable(f"{what}: the answer is not JSON") from e

    async def call(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """One call to C{path} (under the API's base URL); its decoded JSON
        answer. For callers with collections of their own
        (L{fleetd.tinkerbell.api}); the errors are L{KubeError}s."""
        return await self._call(method, path, what, body, query)

    def close(self) -> Deferred[None] | None:
        """
        Cancel the calls in flight (a connection one holds would otherwise
        return to the pool after it closed) and close pooled connections
        (the daemon stops).
        """
        for call in list(self._inflight):
            call.cancel()
        if self._pool is None:
            return None
        result: Deferred[None] = self._pool.closeCachedConnections()
        return result

    # Secrets in kube-system

    async def createSecret(self, secret: Mapping[str, Any]) -> dict[str, Any]:
        name = secret["metadata"]["name"]
        result: dict[str, Any] = await self._call(
            "POST", SECRETS, f"create secret {name}", body=dict(secret)
        )
        return result

    async def getSecret(self, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call(
                "GET", f"{SECRETS}/{quote(name)}", f"get secret {name}"
            )
        except NotFound:
            return None
        return result

    async def deleteSecret(self, name: str) -> bool:
        """Delete; L{False} when it was already gone (deleting is idempotent)."""
        try:
            await self._call(
                "DELETE", f"{SECRETS}/{quote(name)}", f"delete secret {name}"
            )
        except NotFound:
            return False
        return True

    # CertificateSigningRequests

    async def listCSRs(self) -> tuple[list[dict[str, Any]], str]:
        """Every kubelet client CSR, and the list's resourceVersion."""
        doc = await self._call(
            "GET",
            CSRS,
            "list csrs",
            query={"fieldSelector": f"spec.signerName={KUBELET_CLIENT_SIGNER}"},
        )
        items = doc.get("items") or []
        return list(items), str(doc.get("metadata", {}).get("resourceVersion", ""))

    async def getCSR(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "GET", f"{CSRS}/{quote(name)}", f"get csr {name}"
        )
        return result

    def watchCSRs(
        self,
        resourceVersion: str,
        onEvent: Callable[[dict[str, Any]], None],
        timeoutSeconds: int = 300,
    ) -> Watch:
        """
        Watch kubelet client CSRs from C{resourceVersion}, with bookmarks.
        C{onEvent} gets each event (ADDED, MODIFIED, DELETED, BOOKMARK,
        ERROR) as decoded; the returned L{Watch}'s C{done} fires when the
        server ends the stream, or fails (L{KubeUnavailable}, L{Gone} for
        a 410 answer).
        """
        return self._watch(
            CSRS,
            {"fieldSelector": f"spec.signerName={KUBELET_CLIENT_SIGNER}"},
            "watch csrs",
            resourceVersion,
            onEvent,
            timeoutSeconds,
        )

    def _watch(
        self,
        path: str,
        extra: Mapping[str, str],
        what: str,
        resourceVersion: str,
        onEvent: Callable[[dict[str, Any]], None],
        timeoutSeconds: int,
    ) -> Watch:
        """A watch of the collection at C{path} (see L{watchCSRs})."""
        query = {
            "watch": "1",
            "resourceVersion": resourceVersion,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeoutSeconds),
            **extra,
        }
        url = f"{self.api}{path}?{urlencode(query)}"
        request = self._http.request("GET", url, headers=self._headers())
        return Watch(what).follow(request, onEvent, self._clock, timeoutSeconds)

    # Tinkerbell Workflows (read only: boot completion's second signal)

    async def listWorkflows(
        self, namespace: str | None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every Workflow in C{namespace} (L{None}: all namespaces), and the
        list's resourceVersion."""
        doc = await self._call("GET", workflowsPath(namespace), "list workflows")
        items = doc.get("items") or []
        return list(items), str(doc.get("metadata", {}).get("resourceVersion", ""))

    def watchWorkflows(
        self,
        namespace: str | None,
        resourceVersion: str,
        onEvent: Callable[[dict[str, Any]], None],
        timeoutSeconds: int = 300,
    ) -> Watch:
        """Watch Workflows in C{namespace} (L{None}: all), as L{watchCSRs}."""
        return self._watch(
            workflowsPath(namespace),
            {},
            "watch workflows",
            resourceVersion,
            onEvent,
            timeoutSeconds,
        )

    async def approveCSR(
        self, name: str, check: Callable[[dict[str, Any]], bool], message: str
    ) -> dict[str, Any] | None:
        """
        Append an Approved condition through the approval subresource.

        C{check(csr)} is asked before each attempt, on the object as read:
        L{False} (it changed into something we no longer approve, or it is
        already decided) gives up and returns L{None}. A 409 (a stale
        resourceVersion) reads it again and retries.
        """
        csr = await self.getCSR(name)
        for _ in range(APPROVE_ATTEMPTS):
            if not check(csr):
                return None
            conditions = list((csr.get("status") or {}).get("conditions") or [])
            conditions.append(
                {
                    "type": "Approved",
                    "status": "True",
                    "reason": "FleetdApproved",
                    "message": message,
                }
            )
            body = dict(csr)
            body["status"] = {**(csr.get("status") or {}), "conditions": conditions}
            try:
                result: dict[str, Any] = await self._call(
                    "PUT", f"{CSRS}/{quote(name)}/approval", f"approve csr {name}", body
                )
                return result
            except Conflict:
                csr = await self.getCSR(name)
        raise KubeUnavailable(f"approve csr {name}: still conflicting after retries")

    # Nodes and RBAC

    async def deleteNode(self, name: str) -> bool:
        """Delete the Node; L{False} when there was none."""
        try:
            await self._call("DELETE", f"{NODES}/{quote(name)}", f"delete node {name}")
        except NotFound:
            return False
        return True

    async def listClusterRoles(self) -> list[dict[str, Any]]:
        doc = await self._call("GET", ROLES, "list clusterroles")
        return list(doc.get("items") or [])

    async def listClusterRoleBindings(self) -> list[dict[str, Any]]:
        doc = await self._call("GET", BINDINGS, "list clusterrolebindings")
        return list(doc.get("items") or [])

    async def listRoleBindings(self) -> list[dict[str, Any]]:
        """RoleBindings in every namespace."""
        doc = await self._call("GET", NAMESPACED_BINDINGS, "list rolebindings")
        return list(doc.get("items") or [])

    async def listRoles(self) -> list[dict[str, Any]]:
        """Roles in every namespace."""
        doc = await self._call("GET", NAMESPACED_ROLES, "list roles")
        return list(doc.get("items") or [])
