"""
A strict in-process fake of the parts of the Kubernetes API fleetd uses.

Served as a C{twisted.web} resource (through C{treq.testing.StubTreq} via
L{FakeKube.http}, or on a loopback listener). What it models, each from
the documentation or source named in C{notes/kube-netbox.md}:

  - one cluster-wide C{resourceVersion} counter; every write bumps it and
    stamps the object (api-concepts: resource versions);
  - updates carrying a stale C{metadata.resourceVersion} get 409 Conflict;
    creating a taken name gets 409 AlreadyExists; unknown objects 404;
    errors are C{kind: Status} objects with C{reason} and C{code};
  - LIST returns the items in key order (etcd's: by name, or namespace
    and name) and C{metadata.resourceVersion}; WATCH from a version streams
    newline-delimited JSON events (ADDED, MODIFIED, DELETED), then stays
    open; BOOKMARK events (only C{metadata.resourceVersion}) only when
    C{allowWatchBookmarks=true} and only when the test asks (a server need
    not send any); a version older than the kept history (L{compact})
    gets a 200 stream holding one ERROR event with a 410 Status, then the
    end (client-go practice, section 2.3); C{timeoutSeconds} ends a watch;
  - C{fieldSelector=spec.signerName=...} on CSRs;
  - Secrets: C{metadata.name} a DNS subdomain (or C{generateName}),
    namespace must match the path, C{data} values base64, keys
    C{[-._a-zA-Z0-9]+}, C{stringData} merged into C{data} and never
    returned (Secrets are never updated by fleetd, so PUT is not
    modelled). The API server does not check a
    bootstrap token Secret's fields; the bootstrap authenticator does,
    when the token is used: L{FakeKube.authenticate} applies its checks
    (type, name, id, secret, expiration, usage, groups: section 1);
  - CSRs: C{spec.username}/C{groups}/C{uid} are set by the server from
    the identity that created the CSR; C{spec.request} must be a PEM
    CERTIFICATE REQUEST (base64 in JSON) with a valid signature (only the
    SAN extension is parsed, as Go does); C{signerName} and C{usages}
    required; the C{/approval} subresource changes only the conditions:
    Approved and Denied exclusive, a duplicate type refused, condition
    status C{"True"} (422 Invalid) (section 2.2);
  - L{sign} models the csrsigning controller: an Approved CSR gets a
    certificate for its subject, valid C{signingDuration};
  - Nodes (create, get, delete);
  - RBAC: ClusterRoles and ClusterRoleBindings (list, create), Roles and
    RoleBindings (list in all namespaces or one, create in one), checked
    as the API server checks them (L{fleetd.testing.kube_rbac});
  - Tinkerbell Hardware and Workflows (C{tinkerbell.org/v1alpha1},
    namespaced; notes tinkerbell.md section 3): create, get, list (label
    selectors), update (resourceVersion, 409), delete (preconditions), and
    a watch of Workflows, in one namespace or all; 404 for the whole group
    while the CRDs are not installed (C{workflowsInstalled = False}); an
    optional C{validator} refuses objects with 422
    (L{fleetd.testing.kube_tink}). The test plays tink-controller with
    C{addWorkflow} and C{setWorkflowState}, in the monorepo's shape
    (C{status.agentID}, C{tasks[].agentID}, states without prefix) or tink
    v0.12's (C{STATE_} prefix, C{tasks[].worker});
  - a bearer token: the admin token (fleetd's service account), a
    bootstrap token, or a kubelet credential from L{nodeCredential}.

Faults: L{failNext} answers the next matching call with a status;
L{hangNext} never answers it; L{loseAnswerNext} applies it and then
loses the answer (a timeout or a cut connection); C{reachable = False}
refuses connections (through L{http}).
"""

from __future__ import annotations

import base64
import json
import re
import uuid as uuidlib
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import Resource

from fleetd.k8s.client import KubeClient
from fleetd.testing.kube_http import CSR, WORKFLOW, KubeHTTP, Watcher
from fleetd.testing.kube_rbac import FakeRBAC
from fleetd.testing.kube_rules import (
    SUBDOMAIN,
    ApiError,
    Identity,
    approvedCSR,
    csrFromBody,
    csrPEM,
    invalid,
    issueCertificate,
    malformedBasicConstraintsPEM,
    parseTime,
    rfc3339,
    secretFromBody,
)
from fleetd.testing.kube_tink import MONOREPO_STATES, FakeTinkerbell, Validator

_TOKEN = re.compile(r"([a-z0-9]{6})\.([a-z0-9]{16})")
_GROUP = re.compile(r"\Asystem:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]\Z")

__all__ = [
    "MONOREPO_STATES",
    "ApiError",
    "FakeKube",
    "Identity",
    "csrPEM",
    "malformedBasicConstraintsPEM",
]


class FakeKube(FakeRBAC, FakeTinkerbell):
    """The fake cluster's state and its HTTP face."""

    def __init__(self, clock: IReactorTime, adminToken: str = "fleetd-sa-token"):
        self.clock = clock
        self.adminToken = adminToken
        self.rv = 1000
        self.secrets: dict[str, dict[str, Any]] = {}
        self.csrs: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.bindings: dict[str, dict[str, Any]] = {}
        self.roles: dict[str, dict[str, Any]] = {}
        self.roleBindings: dict[str, dict[str, Any]] = {}  # "namespace/name"
        self.namespacedRoles: dict[str, dict[str, Any]] = {}  # "namespace/name"
        self.workflows: dict[str, dict[str, Any]] = {}  # "namespace/name"
        self.hardware: dict[str, dict[str, Any]] = {}  # "namespace/name"
        # Templates applied by the operator, read (not served) by the test
        # or the sim playing tink-controller: "namespace/name".
        self.templates: dict[str, dict[str, Any]] = {}
        self.workflowsInstalled = True  # the Tinkerbell CRDs
        # Asked on each create and update of Hardware and Workflows:
        # C{validator(kind, obj)} returns why it is invalid (422), or None.
        self.validator: Validator | None = None
        self.history: list[tuple[int, str, dict[str, Any], str]] = []
        self.oldest = self.rv  # watches from before this get 410
        self.watchers: list[Watcher] = []
        self.faults: list[tuple[str, str, int, str]] = []
        self.reachable = True
        self.calls: list[tuple[str, str]] = []
        self.signingDuration = 365 * 86400.0
        self._credentials: dict[str, Identity] = {}
        self._stubs: list[Any] = []
        self._flushing = False
        self._flushAgain = False
        self._generated = 0

    # Test controls

    def http(self) -> Any:
        """A treq-like client for this fake (C{StubTreq}), honouring faults."""
        from treq.testing import StubTreq

        stub: Any = StubTreq(self.resource())  # type: ignore[no-untyped-call]
        self._stubs.append(stub)
        fake = self

        class _Client:
            def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
                if not fake.reachable:
                    return fail(ConnectionRefusedError("fake kube is down"))
                d: Deferred[Any] = stub.request(method, url, **kwargs)
                fake.flush()
                return d

        return _Client()

    def client(self, bearer: str | None = None) -> KubeClient:
        """
        A L{KubeClient} for C{https://kube.test} over L{http}, on this
        fake's clock, presenting the admin token unless C{bearer} is given.
        """
        return KubeClient(
            "https://kube.test",
            self.http(),
            self.clock,
            bearer=self.adminToken if bearer is None else bearer,
        )

    def flush(self) -> None:
        """
        Deliver what is pending between clients and the fake (StubTreq).
        Re-entrant calls (a client reacting to data by making a request)
        ask the outermost call for another round: C{StubTreq.flush} itself
        must not be nested, or it loses the connections it is pumping.
        """
        if self._flushing:
            self._flushAgain = True
            return
        self._flushing = True
        try:
            while True:
                self._flushAgain = False
                for stub in self._stubs:
                    stub.flush()
                if not self._flushAgain:
                    break
        finally:
            self._flushing = False

    def failNext(self, method: str, contains: str, code: int, reason: str = "") -> None:
        """Answer the next C{method} call whose path contains C{contains}."""
        self.faults.append((method, contains, code, reason or "InternalError"))

    def hangNext(self, method: str, contains: str) -> None:
        """Never answer the next matching call (a hung API server)."""
        self.faults.append((method, contains, 0, "hang"))

    def loseAnswerNext(self, method: str, contains: str, cut: bool = False) -> None:
        """
        Apply the next matching call, then lose its answer: never send it
        (the client's deadline ends the call, a timeout) or, with C{cut},
        close the connection instead of answering.
        """
        self.faults.append((method, contains, 0, "cut" if cut else "lose"))

    def compact(self) -> None:
        """Forget the event history, as etcd does after ~5 minutes."""
        self.history.clear()
        self.oldest = self.rv + 1

    def bookmark(self) -> None:
        """Send a BOOKMARK to every watch that allowed them."""
        for watcher in list(self.watchers):
            if watcher.bookmarks:
                kind, version = (
                    ("Workflow", "tinkerbell.org/v1alpha1")
                    if watcher.resource == WORKFLOW
                    else ("CertificateSigningRequest", "certificates.k8s.io/v1")
                )
                self.sendEvent(
                    watcher,
                    "BOOKMARK",
                    {
                        "kind": kind,
                        "apiVersion": version,
                        "metadata": {"resourceVersion": str(self.rv)},
                    },
                )
        self.flush()

    def closeWatches(self) -> None:
        """End every open watch stream (an API server restart)."""
        for watcher in list(self.watchers):
            self.endWatch(watcher)
        self.flush()

    def nodeCredential(self, node: str) -> str:
        """A bearer standing for the kubelet client certificate of C{node}."""
        bearer = f"kubelet-{node}-{len(self._credentials)}"
        self._credentials[bearer] = Identity(
            f"system:node:{node}", ["system:nodes", "system:authenticated"]
        )
        return bearer

    # The bootstrap authenticator (plugin/pkg/auth/authenticator/token/bootstrap)

    def authenticate(self, bearer: str) -> Identity | None:
        if bearer == self.adminToken:
            return Identity("system:serviceaccount:kube-system:fleetd", [])
        if bearer in self._credentials:
            return self._credentials[bearer]
        match = _TOKEN.fullmatch(bearer)
        if match is None:
            return None
        tokenId, tokenSecret = match.groups()
        secret = self.secrets.get(f"bootstrap-token-{tokenId}")
        if secret is None or secret["metadata"].get("deletionTimestamp"):
            return None
        if secret.get("type") != "bootstrap.kubernetes.io/token":
            return None
        data = {
            k: base64.b64decode(v).decode("utf-8", "replace")
            for k, v in (secret.get("data") or {}).items()
        }
        if data.get("token-secret") != tokenSecret or data.get("token-id") != tokenId:
            return None
        expiration = data.get("expiration")
        if expiration is not None:
            try:
                if parseTime(expiration) <= self.clock.seconds():
                    return None
            except ValueError:
                return None
        if data.get("usage-bootstrap-authentication") != "true":
            return None
        groups = ["system:bootstrappers"]
        extra = data.get("auth-extra-groups")
        if extra:
            for group in extra.split(","):
                if _GROUP.match(group.strip()) is None:
                    return None
                groups.append(group.strip())
        return Identity(f"system:bootstrap:{tokenId}", groups)

    # Kubelet side

    def fileCSR(
        self,
        bearer: str,
        pem: bytes,
        *,
        usages: list[str] | None = None,
        signer: str = "kubernetes.io/kube-apiserver-client-kubelet",
        name: str | None = None,
    ) -> dict[str, Any]:
        """
        File a CSR as the kubelet does, authenticated by C{bearer}; C{name}
        is the requester's own choice of name (the kubelet's is generated).
        """
        identity = self.authenticate(bearer)
        if identity is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name} if name else {"generateName": "csr-"},
            "spec": {
                "request": base64.b64encode(pem).decode("ascii"),
                "signerName": signer,
                "usages": usages or ["digital signature", "client auth"],
            },
        }
        return self.postCSR(body, identity)

    def sign(self) -> None:
        """The csrsigning controller: issue a certificate for approved CSRs."""
        for name, csr in list(self.csrs.items()):
            status = csr.get("status") or {}
            types = {c["type"] for c in status.get("conditions") or []}
            if "Approved" not in types or status.get("certificate"):
                continue
            updated: dict[str, Any] = json.loads(json.dumps(csr))
            updated["status"]["certificate"] = issueCertificate(
                csr, self.clock.seconds(), self.signingDuration
            )
            self._store(self.csrs, name, updated, "MODIFIED")

    def addNode(self, name: str) -> None:
        self.createIn(
            self.nodes, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        )

    # Storage

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def createIn(
        self, store: dict[str, dict[str, Any]], obj: dict[str, Any]
    ) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise invalid(
                    "metadata.name: Required value: name or generateName is required"
                )
            self._generated += 1
            meta["name"] = f"{prefix}{self._generated:05d}"
            del meta["generateName"]
        name = meta["name"]
        if len(name) > 253 or SUBDOMAIN.fullmatch(name) is None:
            raise invalid(
                f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain"  # noqa: E501
            )
        if name in store:
            raise ApiError(409, "AlreadyExists", f'"{name}" already exists')
        meta["uid"] = str(uuidlib.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock.seconds())
        self._store(store, name, obj, "ADDED")
        return obj

    def _store(
        self,
        store: dict[str, dict[str, Any]],
        name: str,
        obj: dict[str, Any],
        kind: str,
    ) -> None:
        obj["metadata"]["resourceVersion"] = self._bump()
        store[name] = obj
        if store is self.csrs:
            self._event(kind, obj, CSR)
        elif store is self.workflows:
            self._event(kind, obj, WORKFLOW)

    def deleteFrom(self, store: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
        obj = store.pop(name, None)
        if obj is None:
            raise ApiError(404, "NotFound", f'"{name}" not found')
        obj["metadata"]["resourceVersion"] = self._bump()
        if store is self.csrs:
            self._event("DELETED", obj, CSR)
        elif store is self.workflows:
            self._event("DELETED", obj, WORKFLOW)
        return obj

    def _event(self, kind: str, obj: dict[str, Any], resource: str) -> None:
        copy = json.loads(json.dumps(obj))
        self.history.append((self.rv, kind, copy, resource))
        for watcher in list(self.watchers):
            if watcher.wants(resource, copy):
                self.sendEvent(watcher, kind, copy)

    def sendEvent(self, watcher: Watcher, kind: str, obj: dict[str, Any]) -> None:
        line = json.dumps({"type": kind, "object": obj}).encode("utf-8") + b"\n"
        watcher.request.write(line)

    def forgetWatch(self, watcher: Watcher) -> None:
        """The stream ended (either side): forget it and its timer."""
        if watcher in self.watchers:
            self.watchers.remove(watcher)
        if watcher.timer is not None and watcher.timer.active():
            watcher.timer.cancel()

    def endWatch(self, watcher: Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)
            if watcher.timer is not None and watcher.timer.active():
                watcher.timer.cancel()
            if not watcher.request.finished:
                watcher.request.finish()

    # Objects (the API server's rules: fleetd.testing.kube_rules)

    def postSecret(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.createIn(self.secrets, secretFromBody(body))

    def postCSR(self, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        return self.createIn(self.csrs, csrFromBody(body, identity))

    def putApproval(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        now = rfc3339(self.clock.seconds())
        updated = approvedCSR(self.csrs.get(name), name, body, now)
        self._store(self.csrs, name, updated, "MODIFIED")
        return updated

    # HTTP

    def resource(self) -> Resource:
        return KubeHTTP(self)
