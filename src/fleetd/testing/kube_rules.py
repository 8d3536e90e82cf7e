"""
The API server's rules for the objects the fake serves (pure functions):
Secret and CSR validation, the approval subresource, error Status
objects, and kubelet-shaped test CSRs. Sources in L{fleetd.testing.kube}.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


def rfc3339(at: float) -> str:
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parseTime(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class ApiError(Exception):
    """An error answer: a C{kind: Status} object with reason and code."""

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


def invalid(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def namespaceMismatch() -> ApiError:
    """400: the body names another namespace than the request's path."""
    return ApiError(
        400,
        "BadRequest",
        "the namespace of the provided object does not match the namespace sent on the request",  # noqa: E501
    )


def modified(resource: str, name: str) -> ApiError:
    """409 Conflict: an update from a stale C{resourceVersion} of C{name}
    (C{resource} as C{plural.group})."""
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; please apply your changes to the latest version and try again',  # noqa: E501
    )


@dataclass
class Identity:
    """Who a request authenticated as."""

    username: str
    groups: list[str] = field(default_factory=list)
    uid: str = ""


def secretFromBody(body: dict[str, Any]) -> dict[str, Any]:
    """A Secret as the API server stores it, or the ApiError it answers."""
    meta = body.get("metadata") or {}
    if meta.get("namespace") not in (None, "kube-system"):
        raise namespaceMismatch()
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {**meta, "namespace": "kube-system"},
        "type": body.get("type") or "Opaque",
        "data": {},
    }
    for key, value in (body.get("data") or {}).items():
        checkKey(key)
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError) as e:
            raise invalid(f"data[{key}]: Invalid value: illegal base64 data") from e
        secret["data"][key] = value
    for key, value in (body.get("stringData") or {}).items():
        checkKey(key)
        if not isinstance(value, str):
            raise ApiError(400, "BadRequest", f"stringData[{key}] must be a string")
        secret["data"][key] = base64.b64encode(value.encode("utf-8")).decode("ascii")
    data: dict[str, str] = secret["data"]
    if sum(len(v) for v in data.values()) > 1 << 20:
        raise invalid("data: Too long: must have at most 1048576 bytes")
    return secret


def checkKey(key: str) -> None:
    if not isinstance(key, str) or _KEY.fullmatch(key) is None or len(key) > 253:
        raise invalid(
            f"data[{key}]: Invalid value: a valid config key must consist of alphanumeric characters, '-', '_' or '.'"  # noqa: E501
        )


def csrFromBody(body: dict[str, Any], identity: Identity) -> dict[str, Any]:
    """A CSR as the API server stores it: the requester set from C{identity}."""
    spec = dict(body.get("spec") or {})
    try:
        pem = base64.b64decode(spec.get("request") or "", validate=True)
        request = x509.load_pem_x509_csr(pem)
    except (binascii.Error, ValueError, TypeError) as e:
        raise invalid(
            "spec.request: Invalid value: []byte{...}: PEM block type must be CERTIFICATE REQUEST"  # noqa: E501
        ) from e
    # The API server parses the request (Go reads only the SAN extension of
    # a CSR, so other malformed extensions pass) and checks its signature.
    if not request.is_signature_valid:
        raise invalid(
            "spec.request: Invalid value: []byte{...}: x509: ECDSA verification failure"
        )
    if not spec.get("signerName"):
        raise invalid("spec.signerName: Required value")
    if not spec.get("usages"):
        raise invalid("spec.usages: Required value")
    if "expirationSeconds" in spec and int(spec["expirationSeconds"]) < 600:
        raise invalid(
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
    return csr


def approvedCSR(
    current: dict[str, Any] | None, name: str, body: dict[str, Any], now: str
) -> dict[str, Any]:
    """C{current} after the approval subresource took C{body}, or its ApiError."""
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
        raise modified("certificatesigningrequests.certificates.k8s.io", name)
    conditions = list((body.get("status") or {}).get("conditions") or [])
    seen: set[str] = set()
    for condition in conditions:
        kind = condition.get("type")
        if kind in seen:
            raise invalid(f"status.conditions: Duplicate value: {kind!r}")
        seen.add(kind)
        if kind in ("Approved", "Denied") and condition.get("status") != "True":
            raise invalid(
                'status.conditions[].status: Unsupported value: only "True" is allowed'
            )
    if {"Approved", "Denied"} <= seen:
        raise invalid(
            "status.conditions: Invalid value: Approved and Denied conditions are mutually exclusive"  # noqa: E501
        )
    old = {c["type"] for c in (current.get("status") or {}).get("conditions") or []}
    if "Denied" in old and "Approved" in seen:
        raise invalid(
            "status.conditions: Forbidden: updated condition of type Denied may not be removed"  # noqa: E501
        )
    if "Approved" in old and "Approved" not in seen:
        raise invalid(
            "status.conditions: Forbidden: updated condition of type Approved may not be removed"  # noqa: E501
        )
    updated: dict[str, Any] = json.loads(json.dumps(current))
    updated["status"]["conditions"] = [
        {
            **c,
            "lastUpdateTime": c.get("lastUpdateTime", now),
            "lastTransitionTime": c.get("lastTransitionTime", now),
        }
        for c in conditions
    ]
    return updated


def issueCertificate(csr: dict[str, Any], now: float, duration: float) -> str:
    """What the csrsigning controller adds: a certificate (base64 PEM)."""
    request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
    key = ec.generate_private_key(ec.SECP256R1())
    start = datetime.datetime.fromtimestamp(now, datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(request.subject)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")]))
        .public_key(request.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(seconds=duration))
        .sign(key, hashes.SHA256())
    )
    return base64.b64encode(cert.public_bytes(Encoding.PEM)).decode("ascii")


def csrPEM(
    commonName: str,
    organizations: tuple[str, ...] = ("system:nodes",),
    *,
    dnsNames: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> bytes:
    """A kubelet-shaped certificate request (EC P-256, as kubelets make)."""
    import ipaddress

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


def _der(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        head = bytes([size])
    else:
        length = size.to_bytes((size.bit_length() + 7) // 8, "big")
        head = bytes([0x80 | len(length)]) + length
    return bytes([tag]) + head + content


def malformedBasicConstraintsPEM(commonName: str) -> bytes:
    """
    A kubelet-shaped request carrying an extension whose OID is patched
    to basicConstraints (2.5.29.19) with the value C{02 01 05} (an
    INTEGER, not the SEQUENCE the extension is), re-signed. Go, and so
    kube-apiserver, reads only a CSR's SAN extension and accepts it;
    C{cryptography} raises C{ValueError} on C{request.extensions}.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    placeholder = x509.ObjectIdentifier("1.2.3.4")  # DER 06 03 2a 03 04
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                    x509.NameAttribute(NameOID.COMMON_NAME, commonName),
                ]
            )
        )
        .add_extension(
            x509.UnrecognizedExtension(placeholder, b"\x02\x01\x05"), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    tbs = request.tbs_certrequest_bytes
    patched = tbs.replace(b"\x06\x03\x2a\x03\x04", b"\x06\x03\x55\x1d\x13", 1)
    whole = request.public_bytes(Encoding.DER)
    rest = whole[whole.index(tbs) + len(tbs) :]
    algorithm = rest[: 2 + rest[1]]
    signature = key.sign(patched, ec.ECDSA(hashes.SHA256()))
    der = _der(0x30, patched + algorithm + _der(0x03, b"\x00" + signature))
    body = base64.encodebytes(der).replace(b"\n", b"")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return (
        b"-----BEGIN CERTIFICATE REQUEST-----\n"
        + b"\n".join(lines)
        + b"\n-----END CERTIFICATE REQUEST-----\n"
    )


def checkLabels(labels: object) -> None:
    """metav1 validation of C{metadata.labels}: 422 on a bad key or value."""
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise invalid("metadata.labels: Invalid value: must be a map")
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if prefix and (len(prefix) > 253 or SUBDOMAIN.fullmatch(prefix) is None):
            raise invalid(f"metadata.labels: Invalid value: {key!r}: bad prefix")
        if _LABEL_NAME.fullmatch(name) is None:
            raise invalid(f"metadata.labels: Invalid value: {key!r}: bad name")
        if not isinstance(value, str) or _LABEL_VALUE.fullmatch(value) is None:
            raise invalid(f"metadata.labels: Invalid value: {value!r}: bad value")


def selects(selector: str | None, labels: dict[str, str]) -> bool:
    """Whether an equality-based C{labelSelector} selects C{labels}."""
    if not selector:
        return True
    for term in selector.split(","):
        term = term.strip()
        if "!=" in term:
            key, _, value = term.partition("!=")
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, _, value = term.replace("==", "=").partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True
