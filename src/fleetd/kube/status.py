"""
[K7] What C{fleetctl status} says about a device's cluster credentials.

Read from the database alone (so it answers with or without
C{[kubernetes]}): the latest per-node token (id, expiry, deletion
deadline, deletion) and the kubelet client certificate (first approval,
last approval, notAfter when fleetd saw it issued, retirement). L{assess}
turns them into the explanation and the recovery step: a per-node token
that expired before its kubelet's certificate was approved, or a kubelet
certificate that expired, can only be recovered by a new provision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twisted.internet.interfaces import IReactorTime

from fleetd.kube.store import KubeletRecord, TokenRecord, kubelet, latestNodeToken
from fleetd.kube.tokens import rfc3339
from fleetd.store.db import Database
from fleetd.store.runner import IRunner

LOST_CERTIFICATE = (
    "if the node loses its kubelet client certificate (EPHEMERAL wiped) or it"
    " expires after a year offline, it cannot rejoin: a new provision is the"
    " recovery"
)


@dataclass(frozen=True)
class Credentials:
    token: TokenRecord | None
    kubelet: KubeletRecord | None
    now: float

    def toJSON(self) -> dict[str, Any]:
        token = None
        if self.token is not None:
            token = self.token.toJSON()
            token["expired"] = (
                self.token.expires_at is not None and self.now >= self.token.expires_at
            )
        return {
            "token": token,
            "kubelet": None if self.kubelet is None else self.kubelet.toJSON(),
            "note": None if self.kubelet is None else LOST_CERTIFICATE,
        }


class KubeStatus:
    """Credential facts per device, for L{fleetd.fleet.status.StatusService}."""

    def __init__(self, runner: IRunner, clock: IReactorTime) -> None:
        self._runner = runner
        self._clock = clock

    async def credentials(self, device: str) -> Credentials:
        def read(db: Database) -> tuple[TokenRecord | None, KubeletRecord | None]:
            return latestNodeToken(db, device), kubelet(db, device)

        token, record = await self._runner.run(read)
        return Credentials(token, record, self._clock.seconds())


def assess(
    name: str, runState: str | None, creds: Credentials
) -> tuple[str, str] | None:
    """
    The state line and recovery step when the credentials need one [K7],
    else L{None}.
    """
    provision = f"fleetctl provision {name} (the new run carries a new token)"
    cert = creds.kubelet
    if cert is not None and cert.retired_at is not None:
        return None
    if cert is not None and cert.not_after is not None and creds.now >= cert.not_after:
        return (
            f"its kubelet client certificate expired at {rfc3339(cert.not_after)}:"
            " the node can no longer reach the cluster",
            provision,
        )
    token = creds.token
    if (
        token is not None
        and token.approved_at is None
        and token.expires_at is not None
        and creds.now >= token.expires_at
        and runState in ("ready", "delivering", "consumed")
        and token.run is not None
    ):
        return (
            f"its per-node bootstrap token {token.id} expired at"
            f" {rfc3339(token.expires_at)} before its kubelet certificate was"
            " approved: the node cannot join with this configuration",
            provision,
        )
    return None
