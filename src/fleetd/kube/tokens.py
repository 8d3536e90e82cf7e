"""
Bootstrap tokens: minting, the Secret that carries one, and the sealed
form fleetd keeps of the cluster-wide token.

A token is C{<id>.<secret>} (C{[a-z0-9]{6}.[a-z0-9]{16}}); the id is
public (it names the Secret and appears as the CSR requester
C{system:bootstrap:<id>}), the secret part is a credential: it goes into
the Secret and the node's configuration, never into the journal, a log
line or a metric (notes kube-netbox.md section 1).
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN_TYPE = "bootstrap.kubernetes.io/token"  # noqa: S105 (a Secret type)
NODE_GROUP = "system:bootstrappers:fleetd"
"""[K1] Per-node tokens' own extra group, bound only to system:node-bootstrapper."""
TALOS_GROUP = "system:bootstrappers:nodes"
"""The group Talos binds to auto-approval: never given to a per-node token."""
CLUSTER_GROUP = TALOS_GROUP
"""The cluster-wide token replaces Talos's own, so it keeps Talos's group."""
TOKEN_ID = re.compile(r"[a-z0-9]{6}")
BEARER = re.compile(r"([a-z0-9]{6})\.([a-z0-9]{16})")


def _random(n: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(n))


@dataclass(frozen=True)
class Token:
    """A minted token; C{bearer} is the credential (never printed by repr)."""

    id: str
    secret: str = field(repr=False)

    @property
    def bearer(self) -> str:
        return f"{self.id}.{self.secret}"

    @property
    def secretName(self) -> str:
        return secretName(self.id)


def mintToken() -> Token:
    return Token(_random(6), _random(16))


def secretName(tokenId: str) -> str:
    return f"bootstrap-token-{tokenId}"


def rfc3339(at: float) -> str:
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def tokenSecret(
    token: Token,
    *,
    description: str,
    expiresAt: float | None,
    group: str = NODE_GROUP,
) -> dict[str, Any]:
    """
    The C{kube-system} Secret for C{token} [K1]: type
    C{bootstrap.kubernetes.io/token}, authentication only (no signing),
    its extra group, and C{expiration} when given (always, for per-node
    tokens: the backstop if fleetd never deletes it).
    """
    if group == TALOS_GROUP and expiresAt is not None:
        raise ValueError("a per-node token never joins Talos's auto-approve group")
    data = {
        "token-id": token.id,
        "token-secret": token.secret,
        "usage-bootstrap-authentication": "true",
        "auth-extra-groups": group,
        "description": description,
    }
    if expiresAt is not None:
        data["expiration"] = rfc3339(expiresAt)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token.secretName,
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/managed-by": "fleetd"},
        },
        "type": TOKEN_TYPE,
        "stringData": data,
    }


class Sealer:
    """Seal the cluster-wide token at rest (AES-GCM under a derived key)."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, token: Token) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(
            nonce, token.bearer.encode("ascii"), token.id.encode("ascii")
        )

    def open(self, tokenId: str, sealed: bytes) -> Token:
        plain = self._aead.decrypt(sealed[:12], sealed[12:], tokenId.encode("ascii"))
        match = BEARER.fullmatch(plain.decode("ascii"))
        if match is None or match.group(1) != tokenId:
            raise ValueError("sealed token is malformed")
        return Token(match.group(1), match.group(2))
