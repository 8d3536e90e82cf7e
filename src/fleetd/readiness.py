"""
Whether fleetd can serve yet: what C{/healthz}, the C{fleetd_ready} gauge
and systemd are told.

After a start fleetd loads its runs (and the boot states that need them)
before the boot listener serves a configuration; until then the boot
listener answers 503 "starting". L{Readiness} holds that one fact for
everyone else: C{starting} until the load finished, then C{ready}, or
C{failed} with the reason when the load raised (a human must look);
L{fleetd.loading.LoadService} drives it.
L{notifySystemd} sends C{READY=1} to the service manager at the moment
fleetd becomes ready, so C{systemctl start} returns only then
(C{Type=notify}).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from enum import Enum

from prometheus_client import CollectorRegistry, Gauge
from twisted.logger import Logger

log = Logger()


class State(Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"


class Readiness:
    """
    C{starting}, then C{ready} or C{failed} (once, for good: a failed load
    is not retried, the process must be restarted).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.state = State.STARTING
        self.reason: str | None = None
        self._observers: list[Callable[[], None]] = []
        if registry is not None:
            Gauge(
                "fleetd_ready",
                "1 once fleetd loaded its runs and can serve nodes; 0 while"
                " it is starting or after its load failed.",
                registry=registry,
            ).set_function(lambda: 1.0 if self.state is State.READY else 0.0)

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    def whenSettled(self, observer: Callable[[], None]) -> None:
        """
        Call C{observer} once the start-up load finished, loaded or failed
        (at once if it already has): work that may wait, such as the
        journal's first verification, stays out of the load's way.
        """
        if self.state is State.STARTING:
            self._observers.append(observer)
        else:
            observer()

    def loaded(self) -> None:
        """The load finished: fleetd can serve."""
        self._settle(State.READY, None)

    def failed(self, reason: str) -> None:
        """The load raised C{reason}: fleetd cannot serve until restarted."""
        self._settle(State.FAILED, reason)

    def _settle(self, state: State, reason: str | None) -> None:
        if self.state is not State.STARTING:
            return
        self.state, self.reason = state, reason
        observers, self._observers = self._observers, []
        for observer in observers:
            observer()

    def toJSON(self) -> dict[str, str]:
        """C{{"status": "ok"}}, C{"starting"}, or C{"failed"} with the reason."""
        if self.state is State.READY:
            return {"status": "ok"}
        if self.state is State.FAILED:
            return {"status": "failed", "reason": self.reason or "unknown"}
        return {"status": "starting"}


def notifySystemd(message: bytes, environ: Mapping[str, str] | None = None) -> bool:
    """
    Send C{message} (C{b"READY=1"}) to the service manager's
    C{NOTIFY_SOCKET}, as C{sd_notify(3)} does: one datagram on an
    C{AF_UNIX} socket, a path or (leading C{@}) an abstract address.
    Without C{NOTIFY_SOCKET} (not started by systemd) nothing is sent.

    @return: whether the message was sent.
    """
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False  # unset, or a kind of socket (vsock) fleetd is never under
    target = "\0" + address[1:] if address[0] == "@" else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(target)
            sock.sendall(message)
    except OSError as e:
        log.warn(
            "systemd.notify.failed {socket}: {error}", socket=address, error=str(e)
        )
        return False
    return True
