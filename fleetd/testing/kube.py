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
  - LIST returns C{metadata.resourceVersion}; WATCH from a version streams
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
    returned, C{type} immutable. The API server does not check a
    bootstrap token Secret's fields; the bootstrap authenticator does,
    when the token is used: L{FakeKube.authenticate} applies its checks
    (type, name, id, secret, expiration, usage, groups: section 1);
  - CSRs: C{spec.username}/C{groups}/C{uid} are set by the server from
    the identity that created the CSR; C{spec.request} must be a PEM
    CERTIFICATE REQUEST (base64 in JSON); C{signerName} and C{usages}
    required; the C{/approval} subresource changes only the conditions:
    Approved and Denied exclusive, a duplicate type refused, condition
    status C{"True"} (422 Invalid) (section 2.2);
  - L{sign} models the csrsigning controller: an Approved CSR gets a
    certificate for its subject, valid C{signingDuration};
  - Nodes (create, get, delete) and ClusterRoleBindings (list, create);
  - a bearer token: the admin token (fleetd's service account), a
    bootstrap token, or a kubelet credential from L{nodeCredential}.

Faults: L{failNext} answers the next matching call with a status;
L{hangNext} never answers it; C{reachable = False} refuses connections
(through L{http}).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IReactorTime
from twisted.web import server
from twisted.web.resource import Resource

_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_TOKEN = re.compile(r"([a-z0-9]{6})\.([a-z0-9]{16})")
_GROUP = re.compile(r"\Asystem:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]\Z")
SECRETS = ("api", "v1", "namespaces", "kube-system", "secrets")
CSRS = ("apis", "certificates.k8s.io", "v1", "certificatesigningrequests")
NODES = ("api", "v1", "nodes")
BINDINGS = ("apis", "rbac.authorization.k8s.io", "v1", "clusterrolebindings")
ROLES = ("apis", "rbac.authorization.k8s.io", "v1", "clusterroles")


def _rfc3339(at: float) -> str:
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parseTime(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


def _invalid(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


@dataclass
class _Watcher:
    request: Any
    bookmarks: bool
    signer: str | None
    timer: Any = None


@dataclass
class Identity:
    username: str
    groups: list[str] = field(default_factory=list)
    uid: str = ""


class FakeKube:
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
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.oldest = self.rv  # watches from before this get 410
        self.watchers: list[_Watcher] = []
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

    def compact(self) -> None:
        """Forget the event history, as etcd does after ~5 minutes."""
        self.history.clear()
        self.oldest = self.rv + 1

    def bookmark(self) -> None:
        """Send a BOOKMARK to every watch that allowed them."""
        for watcher in list(self.watchers):
            if watcher.bookmarks:
                self._send(
                    watcher,
                    "BOOKMARK",
                    {
                        "kind": "CertificateSigningRequest",
                        "apiVersion": "certificates.k8s.io/v1",
                        "metadata": {"resourceVersion": str(self.rv)},
                    },
                )
        self.flush()

    def closeWatches(self) -> None:
        """End every open watch stream (an API server restart)."""
        for watcher in list(self.watchers):
            self._endWatch(watcher)
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
                if _parseTime(expiration) <= self.clock.seconds():
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
    ) -> dict[str, Any]:
        """File a CSR as the kubelet does, authenticated by C{bearer}."""
        identity = self.authenticate(bearer)
        if identity is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"generateName": "csr-"},
            "spec": {
                "request": base64.b64encode(pem).decode("ascii"),
                "signerName": signer,
                "usages": usages or ["digital signature", "client auth"],
            },
        }
        return self._createCSR(body, identity)

    def sign(self) -> None:
        """The csrsigning controller: issue a certificate for approved CSRs."""
        for name, csr in list(self.csrs.items()):
            status = csr.get("status") or {}
            types = {c["type"] for c in status.get("conditions") or []}
            if "Approved" not in types or status.get("certificate"):
                continue
            request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
            key = ec.generate_private_key(ec.SECP256R1())
            now = datetime.datetime.fromtimestamp(self.clock.seconds(), datetime.UTC)
            cert = (
                x509.CertificateBuilder()
                .subject_name(request.subject)
                .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")]))
                .public_key(request.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now)
                .not_valid_after(now + datetime.timedelta(seconds=self.signingDuration))
                .sign(key, hashes.SHA256())
            )
            from cryptography.hazmat.primitives.serialization import Encoding

            updated: dict[str, Any] = json.loads(json.dumps(csr))
            updated["status"]["certificate"] = base64.b64encode(
                cert.public_bytes(Encoding.PEM)
            ).decode("ascii")
            self._store(self.csrs, name, updated, "MODIFIED")

    def addBinding(self, name: str, role: str, groups: list[str]) -> None:
        self._create(
            self.bindings,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {
                        "kind": "Group",
                        "name": g,
                        "apiGroup": "rbac.authorization.k8s.io",
                    }
                    for g in groups
                ],
            },
        )

    def addRole(self, name: str, rules: list[dict[str, Any]]) -> None:
        self._create(
            self.roles,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": rules,
            },
        )

    def addNode(self, name: str) -> None:
        self._create(
            self.nodes, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        )

    # Storage

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _create(
        self, store: dict[str, dict[str, Any]], obj: dict[str, Any]
    ) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise _invalid(
                    "metadata.name: Required value: name or generateName is required"
                )
            self._generated += 1
            meta["name"] = f"{prefix}{self._generated:05d}"
            del meta["generateName"]
        name = meta["name"]
        if len(name) > 253 or _SUBDOMAIN.fullmatch(name) is None:
            raise _invalid(
                f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain"  # noqa: E501
            )
        if name in store:
            raise ApiError(409, "AlreadyExists", f'"{name}" already exists')
        meta["uid"] = str(uuidlib.uuid4())
        meta["creationTimestamp"] = _rfc3339(self.clock.seconds())
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
            self._event(kind, obj)

    def _delete(self, store: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
        obj = store.pop(name, None)
        if obj is None:
            raise ApiError(404, "NotFound", f'"{name}" not found')
        obj["metadata"]["resourceVersion"] = self._bump()
        if store is self.csrs:
            self._event("DELETED", obj)
        return obj

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        copy = json.loads(json.dumps(obj))
        self.history.append((self.rv, kind, copy))
        for watcher in list(self.watchers):
            if watcher.signer in (None, copy["spec"].get("signerName")):
                self._send(watcher, kind, copy)

    def _send(self, watcher: _Watcher, kind: str, obj: dict[str, Any]) -> None:
        line = json.dumps({"type": kind, "object": obj}).encode("utf-8") + b"\n"
        watcher.request.write(line)

    def _forgetWatch(self, watcher: _Watcher) -> None:
        """The stream ended (either side): forget it and its timer."""
        if watcher in self.watchers:
            self.watchers.remove(watcher)
        if watcher.timer is not None and watcher.timer.active():
            watcher.timer.cancel()

    def _endWatch(self, watcher: _Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)
            if watcher.timer is not None and watcher.timer.active():
                watcher.timer.cancel()
            if not watcher.request.finished:
                watcher.request.finish()

    # Objects

    def _createSecret(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        if meta.get("namespace") not in (None, "kube-system"):
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",  # noqa: E501
            )
        secret: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {**meta, "namespace": "kube-system"},
            "type": body.get("type") or "Opaque",
            "data": {},
        }
        for key, value in (body.get("data") or {}).items():
            self._checkKey(key)
            try:
                base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError) as e:
                raise _invalid(
                    f"data[{key}]: Invalid value: illegal base64 data"
                ) from e
            secret["data"][key] = value
        for key, value in (body.get("stringData") or {}).items():
            self._checkKey(key)
            if not isinstance(value, str):
                raise ApiError(400, "BadRequest", f"stringData[{key}] must be a string")
            secret["data"][key] = base64.b64encode(value.encode("utf-8")).decode(
                "ascii"
            )
        data: dict[str, str] = secret["data"]
        if sum(len(v) for v in data.values()) > 1 << 20:
            raise _invalid("data: Too long: must have at most 1048576 bytes")
        return self._create(self.secrets, secret)

    @staticmethod
    def _checkKey(key: str) -> None:
        if not isinstance(key, str) or _KEY.fullmatch(key) is None or len(key) > 253:
            raise _invalid(
                f"data[{key}]: Invalid value: a valid config key must consist of alphanumeric characters, '-', '_' or '.'"  # noqa: E501
            )

    def _createCSR(self, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        spec = dict(body.get("spec") or {})
        try:
            pem = base64.b64decode(spec.get("request") or "", validate=True)
            x509.load_pem_x509_csr(pem)
        except (binascii.Error, ValueError, TypeError) as e:
            raise _invalid(
                "spec.request: Invalid value: []byte{...}: PEM block type must be CERTIFICATE REQUEST"  # noqa: E501
            ) from e
        if not spec.get("signerName"):
            raise _invalid("spec.signerName: Required value")
        if not spec.get("usages"):
            raise _invalid("spec.usages: Required value")
        if "expirationSeconds" in spec and int(spec["expirationSeconds"]) < 600:
            raise _invalid(
                "spec.expirationSeconds: Invalid value: may not specify a duration less than 600 seconds"  # noqa: E501
            )
        # Set by the server from who asked; whatever the client sent is dropped.
        spec.update(
            username=identity.username,
            groups=list(identity.groups),
            uid=identity.uid,
            extra={},
        )
        csr = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": dict(body.get("metadata") or {}),
            "spec": spec,
            "status": {},
        }
        return self._create(self.csrs, csr)

    def _approve(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        current = self.csrs.get(name)
        if current is None:
            raise ApiError(
                404,
                "NotFound",
                f'certificatesigningrequests.certificates.k8s.io "{name}" not found',
            )
        if (body.get("metadata") or {}).get("name") != name:
            raise ApiError(
                400,
                "BadRequest",
                "the name of the object does not match the name on the URL",
            )
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on certificatesigningrequests.certificates.k8s.io "{name}": the object has been modified; please apply your changes to the latest version and try again',  # noqa: E501
            )
        conditions = list((body.get("status") or {}).get("conditions") or [])
        seen: set[str] = set()
        for condition in conditions:
            kind = condition.get("type")
            if kind in seen:
                raise _invalid(f"status.conditions: Duplicate value: {kind!r}")
            seen.add(kind)
            if kind in ("Approved", "Denied") and condition.get("status") != "True":
                raise _invalid(
                    'status.conditions[].status: Unsupported value: only "True" is allowed'  # noqa: E501
                )
        if {"Approved", "Denied"} <= seen:
            raise _invalid(
                "status.conditions: Invalid value: Approved and Denied conditions are mutually exclusive"  # noqa: E501
            )
        old = {c["type"] for c in (current.get("status") or {}).get("conditions") or []}
        if "Denied" in old and "Approved" in seen:
            raise _invalid(
                "status.conditions: Forbidden: updated condition of type Denied may not be removed"  # noqa: E501
            )
        if "Approved" in old and "Approved" not in seen:
            raise _invalid(
                "status.conditions: Forbidden: updated condition of type Approved may not be removed"  # noqa: E501
            )
        updated: dict[str, Any] = json.loads(json.dumps(current))
        now = _rfc3339(self.clock.seconds())
        updated["status"]["conditions"] = [
            {
                **c,
                "lastUpdateTime": c.get("lastUpdateTime", now),
                "lastTransitionTime": c.get("lastTransitionTime", now),
            }
            for c in conditions
        ]
        self._store(self.csrs, name, updated, "MODIFIED")
        return updated

    # HTTP

    def resource(self) -> Resource:
        return _Root(self)

    def _list(
        self, store: dict[str, dict[str, Any]], kind: str, signer: str | None
    ) -> dict[str, Any]:
        items = [
            o
            for o in store.values()
            if signer is None or o.get("spec", {}).get("signerName") == signer
        ]
        return {
            "kind": kind,
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    def _watch(
        self, request: Any, args: dict[str, list[str]], signer: str | None
    ) -> int:
        rv = int((args.get("resourceVersion") or ["0"])[0] or "0")
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"application/json")
        watcher = _Watcher(
            request, (args.get("allowWatchBookmarks") or [""])[0] == "true", signer
        )
        if rv < self.oldest - 1 and rv != 0:
            gone = ApiError(
                410, "Expired", f"too old resource version: {rv} ({self.oldest})"
            )
            request.write(
                json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n"
            )
            request.finish()
            return server.NOT_DONE_YET
        self.watchers.append(watcher)
        request.notifyFinish().addBoth(lambda _: self._forgetWatch(watcher))
        for at, kind, obj in self.history:
            if at > rv and watcher.signer in (None, obj["spec"].get("signerName")):
                self._send(watcher, kind, obj)
        seconds = args.get("timeoutSeconds")
        if seconds:
            watcher.timer = self.clock.callLater(
                int(seconds[0]), self._endWatch, watcher
            )
        return server.NOT_DONE_YET

    def handle(self, request: Any) -> bytes | int:
        method = request.method.decode("ascii")
        path = tuple(p.decode("utf-8") for p in request.prepath + request.postpath if p)
        args = parse_qs(request.uri.decode("utf-8").partition("?")[2])
        self.calls.append((method, "/" + "/".join(path)))
        try:
            for fault in list(self.faults):
                fmethod, contains, code, reason = fault
                if fmethod == method and contains in "/" + "/".join(path):
                    self.faults.remove(fault)
                    if reason == "hang":
                        return server.NOT_DONE_YET
                    raise ApiError(code, reason, f"injected {code}")
            auth = (request.getHeader(b"authorization") or b"").decode(
                "ascii", "replace"
            )
            identity = (
                self.authenticate(auth[7:]) if auth.startswith("Bearer ") else None
            )
            if identity is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            body: dict[str, Any] = {}
            if method in ("POST", "PUT"):
                try:
                    body = json.loads(
                        request.content.read() if request.content else b""
                    )
                except ValueError as e:
                    raise ApiError(400, "BadRequest", "the body is not JSON") from e
            return self._json(
                request,
                200 if method != "POST" else 201,
                self._route(request, method, path, args, body, identity),
            )
        except ApiError as e:
            return self._json(request, e.code, e.status())
        except _Streaming as s:
            return s.result

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
        table: list[tuple[tuple[str, ...], dict[str, dict[str, Any]], str]] = [
            (SECRETS, self.secrets, "SecretList"),
            (CSRS, self.csrs, "CertificateSigningRequestList"),
            (NODES, self.nodes, "NodeList"),
            (BINDINGS, self.bindings, "ClusterRoleBindingList"),
            (ROLES, self.roles, "ClusterRoleList"),
        ]
        for prefix, store, kind in table:
            if path[: len(prefix)] != prefix:
                continue
            rest = path[len(prefix) :]
            if not rest and method == "GET":
                if (args.get("watch") or [""])[0] in ("1", "true"):
                    if store is not self.csrs:
                        raise ApiError(
                            405, "MethodNotAllowed", "watch is modelled for CSRs only"
                        )
                    raise _Streaming(self._watch(request, args, signer))
                return self._list(store, kind, signer)
            if not rest and method == "POST":
                if store is self.secrets:
                    return self._createSecret(body)
                if store is self.csrs:
                    return self._createCSR(body, identity)
                return self._create(store, body)
            if len(rest) == 1 and method == "GET":
                if rest[0] not in store:
                    raise ApiError(404, "NotFound", f'"{rest[0]}" not found')
                return self._shown(store, store[rest[0]])
            if len(rest) == 1 and method == "DELETE":
                self._delete(store, rest[0])
                return {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            if (
                store is self.csrs
                and len(rest) == 2
                and rest[1] == "approval"
                and method == "PUT"
            ):
                return self._approve(rest[0], body)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not modelled here")
        raise ApiError(
            404, "NotFound", "the server could not find the requested resource"
        )

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


class _Streaming(Exception):
    def __init__(self, result: int) -> None:
        self.result = result


class _Root(Resource):
    isLeaf = True

    def __init__(self, fake: FakeKube) -> None:
        Resource.__init__(self)
        self._fake = fake

    def render(self, request: Any) -> bytes | int:
        return self._fake.handle(request)


def csrPEM(
    commonName: str,
    organizations: tuple[str, ...] = ("system:nodes",),
    *,
    dnsNames: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> bytes:
    """A kubelet-shaped certificate request (EC P-256, as kubelets make)."""
    import ipaddress

    from cryptography.hazmat.primitives.serialization import Encoding

    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations
    ]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, commonName))
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name(attributes)
    )
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dnsNames]
    names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(names), critical=False
        )
    return builder.sign(key, hashes.SHA256()).public_bytes(Encoding.PEM)
