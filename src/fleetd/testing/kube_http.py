"""
The fake API's HTTP face: routing, error Status answers, LIST and WATCH
(newline-delimited JSON events, bookmarks, the 410 ERROR event), as
L{fleetd.testing.kube} describes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs

from twisted.internet.interfaces import IReactorTime
from twisted.web import server
from twisted.web.resource import Resource

from fleetd.testing.kube_rules import ApiError, Identity

SECRETS = ("api", "v1", "namespaces", "kube-system", "secrets")
CSRS = ("apis", "certificates.k8s.io", "v1", "certificatesigningrequests")
NODES = ("api", "v1", "nodes")
BINDINGS = ("apis", "rbac.authorization.k8s.io", "v1", "clusterrolebindings")
ROLES = ("apis", "rbac.authorization.k8s.io", "v1", "clusterroles")
RBAC = ("apis", "rbac.authorization.k8s.io", "v1")
TINKERBELL = ("apis", "tinkerbell.org", "v1alpha1")
CSR, WORKFLOW = "csrs", "workflows"


@dataclass
class Watcher:
    """One open watch stream: of CSRs (maybe of one signer) or of Workflows
    (maybe in one namespace)."""

    request: Any
    bookmarks: bool
    signer: str | None
    timer: Any = None
    resource: str = CSR
    namespace: str | None = None

    def wants(self, resource: str, obj: dict[str, Any]) -> bool:
        if resource != self.resource:
            return False
        if resource == WORKFLOW:
            return self.namespace in (None, obj["metadata"].get("namespace"))
        return self.signer in (None, obj["spec"].get("signerName"))


Store = dict[str, dict[str, Any]]


class KubeState(Protocol):
    """
    The fake cluster as its HTTP face reads and changes it (what
    L{fleetd.testing.kube.FakeKube} provides): the stores by name, the
    watch history, injected faults, and the API server's rules for the
    calls that change objects.
    """

    clock: IReactorTime
    rv: int
    oldest: int  # watches from before this get 410
    secrets: Store
    csrs: Store
    nodes: Store
    bindings: Store
    roles: Store
    roleBindings: Store  # "namespace/name"
    namespacedRoles: Store  # "namespace/name"
    workflows: Store  # "namespace/name"
    workflowsInstalled: bool
    history: list[tuple[int, str, dict[str, Any], str]]
    watchers: list[Watcher]
    faults: list[tuple[str, str, int, str]]
    calls: list[tuple[str, str]]

    def authenticate(self, bearer: str) -> Identity | None:
        """Who a bearer token is, or L{None}."""

    def createIn(self, store: Store, obj: dict[str, Any]) -> dict[str, Any]:
        """POST of C{obj} into C{store}."""

    def deleteFrom(self, store: Store, name: str) -> dict[str, Any]:
        """DELETE of C{name} from C{store}."""

    def postSecret(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST of a Secret."""

    def postCSR(self, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        """POST of a CertificateSigningRequest by C{identity}."""

    def putApproval(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT of CSR C{name}'s approval subresource."""

    def createBinding(
        self, body: dict[str, Any], namespace: str | None
    ) -> dict[str, Any]:
        """POST of a ClusterRoleBinding (C{namespace} L{None}) or RoleBinding."""

    def createRole(self, body: dict[str, Any], namespace: str | None) -> dict[str, Any]:
        """POST of a ClusterRole (C{namespace} L{None}) or Role."""

    def sendEvent(self, watcher: Watcher, kind: str, obj: dict[str, Any]) -> None:
        """Write one watch event to C{watcher}'s stream."""

    def tinkerbellCall(
        self,
        method: str,
        plural: str,
        namespace: str | None,
        name: str | None,
        selector: str | None,
        body: dict[str, Any],
    ) -> Any:
        """A Hardware or Workflow call but a watch (L{fleetd.testing.kube_tink})."""

    def forgetWatch(self, watcher: Watcher) -> None:
        """C{watcher}'s stream ended (either side)."""

    def endWatch(self, watcher: Watcher) -> None:
        """C{watcher}'s C{timeoutSeconds} are up: end its stream."""


class _Streaming(Exception):
    def __init__(self, result: int) -> None:
        self.result = result


class KubeHTTP(Resource):
    """Every path of the fake API, answered from the fake cluster's state."""

    isLeaf = True

    def __init__(self, fake: KubeState) -> None:
        Resource.__init__(self)
        self.fake = fake

    def render(self, request: Any) -> bytes | int:
        return self.handle(request)

    def _list(
        self, store: dict[str, dict[str, Any]], kind: str, signer: str | None
    ) -> dict[str, Any]:
        items = [
            o
            for _, o in sorted(store.items())
            if signer is None or o.get("spec", {}).get("signerName") == signer
        ]
        return {
            "kind": kind,
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self.fake.rv)},
            "items": items,
        }

    def _watch(
        self,
        request: Any,
        args: dict[str, list[str]],
        signer: str | None,
        resource: str = CSR,
        namespace: str | None = None,
    ) -> int:
        rv = int((args.get("resourceVersion") or ["0"])[0] or "0")
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"application/json")
        watcher = Watcher(
            request,
            (args.get("allowWatchBookmarks") or [""])[0] == "true",
            signer,
            resource=resource,
            namespace=namespace,
        )
        if rv < self.fake.oldest - 1 and rv != 0:
            gone = ApiError(
                410, "Expired", f"too old resource version: {rv} ({self.fake.oldest})"
            )
            request.write(
                json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n"
            )
            request.finish()
            return server.NOT_DONE_YET
        self.fake.watchers.append(watcher)
        request.notifyFinish().addBoth(lambda _: self.fake.forgetWatch(watcher))
        for at, kind, obj, what in self.fake.history:
            if at > rv and watcher.wants(what, obj):
                self.fake.sendEvent(watcher, kind, obj)
        seconds = args.get("timeoutSeconds")
        if seconds:
            watcher.timer = self.fake.clock.callLater(
                int(seconds[0]), self.fake.endWatch, watcher
            )
        return server.NOT_DONE_YET

    def handle(self, request: Any) -> bytes | int:
        method = request.method.decode("ascii")
        path = tuple(p.decode("utf-8") for p in request.prepath + request.postpath if p)
        args = parse_qs(request.uri.decode("utf-8").partition("?")[2])
        self.fake.calls.append((method, "/" + "/".join(path)))
        lost = ""
        try:
            for fault in list(self.fake.faults):
                fmethod, contains, code, reason = fault
                if fmethod == method and contains in "/" + "/".join(path):
                    self.fake.faults.remove(fault)
                    if reason == "hang":
                        return server.NOT_DONE_YET
                    if reason in ("lose", "cut"):
                        lost = reason
                        break
                    raise ApiError(code, reason, f"injected {code}")
            auth = (request.getHeader(b"authorization") or b"").decode(
                "ascii", "replace"
            )
            identity = (
                self.fake.authenticate(auth[7:]) if auth.startswith("Bearer ") else None
            )
            if identity is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            body: dict[str, Any] = {}
            if method in ("POST", "PUT", "DELETE"):
                raw = request.content.read() if request.content else b""
                try:
                    body = json.loads(raw) if raw or method != "DELETE" else {}
                except ValueError as e:
                    raise ApiError(400, "BadRequest", "the body is not JSON") from e
            result = self._route(request, method, path, args, body, identity)
            if lost:
                return self._lose(request, lost)
            return self._json(request, 200 if method != "POST" else 201, result)
        except ApiError as e:
            return self._json(request, e.code, e.status())
        except _Streaming as s:
            return s.result

    @staticmethod
    def _lose(request: Any, how: str) -> int:
        """The call was applied; its answer never arrives (L{loseAnswerNext})."""
        if how == "cut":
            request.channel.transport.loseConnection()
        return server.NOT_DONE_YET

    def _route(
        self,
        request: Any,
        method: str,
        path: tuple[str, ...],
        args: dict[str, list[str]],
        body: dict[str, Any],
        identity: Identity,
    ) -> Any:
        signer = None
        for selector in args.get("fieldSelector", []):
            key, _, value = selector.partition("=")
            if key != "spec.signerName":
                raise ApiError(400, "BadRequest", f"field label not supported: {key}")
            signer = value
        if path[: len(TINKERBELL)] == TINKERBELL:
            rest = path[len(TINKERBELL) :]
            return self._tinkerbell(request, method, rest, args, body)
        if path[: len(RBAC)] == RBAC and path[len(RBAC) : len(RBAC) + 1] in (
            ("rolebindings",),
            ("roles",),
            ("namespaces",),
        ):
            return self._namespacedRBAC(method, path[len(RBAC) :], body)
        table: list[tuple[tuple[str, ...], dict[str, dict[str, Any]], str]] = [
            (SECRETS, self.fake.secrets, "SecretList"),
            (CSRS, self.fake.csrs, "CertificateSigningRequestList"),
            (NODES, self.fake.nodes, "NodeList"),
            (BINDINGS, self.fake.bindings, "ClusterRoleBindingList"),
            (ROLES, self.fake.roles, "ClusterRoleList"),
        ]
        for prefix, store, kind in table:
            if path[: len(prefix)] != prefix:
                continue
            rest = path[len(prefix) :]
            if not rest and method == "GET":
                if (args.get("watch") or [""])[0] in ("1", "true"):
                    if store is not self.fake.csrs:
                        raise ApiError(
                            405, "MethodNotAllowed", "watch is modelled for CSRs only"
                        )
                    raise _Streaming(self._watch(request, args, signer))
                return self._list(store, kind, signer)
            if not rest and method == "POST":
                if store is self.fake.secrets:
                    return self.fake.postSecret(body)
                if store is self.fake.csrs:
                    return self.fake.postCSR(body, identity)
                if store is self.fake.bindings:
                    return self.fake.createBinding(body, None)
                if store is self.fake.roles:
                    return self.fake.createRole(body, None)
                return self.fake.createIn(store, body)
            if len(rest) == 1 and method == "GET":
                if rest[0] not in store:
                    raise ApiError(404, "NotFound", f'"{rest[0]}" not found')
                return self._shown(store, store[rest[0]])
            if len(rest) == 1 and method == "DELETE":
                self.fake.deleteFrom(store, rest[0])
                return {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            if (
                store is self.fake.csrs
                and len(rest) == 2
                and rest[1] == "approval"
                and method == "PUT"
            ):
                return self.fake.putApproval(rest[0], body)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not modelled here")
        raise ApiError(
            404, "NotFound", "the server could not find the requested resource"
        )

    def _namespacedRBAC(
        self, method: str, rest: tuple[str, ...], body: dict[str, Any]
    ) -> Any:
        """Roles and RoleBindings: listed in all namespaces
        (C{/rolebindings}) or one (C{/namespaces/NS/rolebindings}), created
        in one."""
        namespace = None
        if len(rest) == 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if rest not in (("rolebindings",), ("roles",)):
            raise ApiError(
                404, "NotFound", "the server could not find the requested resource"
            )
        bindings = rest[0] == "rolebindings"
        if method == "POST" and namespace is not None:
            if bindings:
                return self.fake.createBinding(body, namespace)
            return self.fake.createRole(body, namespace)
        if method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{method} is not modelled here")
        store = self.fake.roleBindings if bindings else self.fake.namespacedRoles
        return {
            "kind": "RoleBindingList" if bindings else "RoleList",
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.fake.rv)},
            "items": [
                o
                for o in store.values()
                if namespace in (None, o["metadata"]["namespace"])
            ],
        }

    def _tinkerbell(
        self,
        request: Any,
        method: str,
        rest: tuple[str, ...],
        args: dict[str, list[str]],
        body: dict[str, Any],
    ) -> Any:
        """Hardware and Workflows (tinkerbell.org/v1alpha1, namespaced), in
        one namespace or all (L{fleetd.testing.kube_tink}); Workflows may be
        watched; 404 when the CRDs are absent."""
        if not self.fake.workflowsInstalled:
            raise ApiError(
                404, "NotFound", "the server could not find the requested resource"
            )
        namespace: str | None = None
        name: str | None = None
        if len(rest) == 1:
            plural = rest[0]
        elif len(rest) in (3, 4) and rest[0] == "namespaces":
            namespace, plural = rest[1], rest[2]
            name = rest[3] if len(rest) == 4 else None
        else:
            plural = ""
        if plural not in ("hardware", "workflows"):
            raise ApiError(
                404, "NotFound", "the server could not find the requested resource"
            )
        watch = (args.get("watch") or [""])[0] in ("1", "true")
        if watch and method == "GET" and name is None:
            if plural != "workflows":
                raise ApiError(
                    405, "MethodNotAllowed", "watch is modelled for Workflows only"
                )
            raise _Streaming(self._watch(request, args, None, WORKFLOW, namespace))
        selector = next(iter(args.get("labelSelector") or []), None)
        return self.fake.tinkerbellCall(method, plural, namespace, name, selector, body)

    def _shown(
        self, store: dict[str, dict[str, Any]], obj: dict[str, Any]
    ) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(obj))
        return copy

    @staticmethod
    def _json(request: Any, code: int, doc: Any) -> bytes:
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(doc).encode("utf-8")
