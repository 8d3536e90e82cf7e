"""
Whether fleetd can serve yet: what C{/healthz}, the C{fleetd_ready} gauge
and systemd are told.

Ready means two things at once (issue 27, item 2): the start-up load
finished (runs, and the boot states that need them; the boot listener
answers 503 "starting" until then), and fleetd completed a TLS handshake,
with ALPN, against each of its own TLS listeners
(L{fleetd.listen.selfcheck}), so a client can connect. L{Readiness}
holds those facts for everyone else:

  - C{starting}: the load runs, or a listener has not passed its
    self-check yet (the reason names it);
  - C{ready}: loaded and every listener passed its latest self-check;
  - C{degraded}: it was ready, and a later self-check failed (the reason
    names the listener); ready again once it passes;
  - C{failed}: the load raised; for good, a human must look.

L{fleetd.loading.LoadService} and the self-check drive it. The service
manager hears C{READY=1} (L{notifySystemd}, C{Type=notify}) the first time
fleetd is ready, so C{systemctl start} returns only then; later changes
reach it as C{STATUS=} lines.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Mapping
from enum import Enum

from prometheus_client import CollectorRegistry, Gauge
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

log = Logger()


class State(Enum):
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    FAILED = "failed"


class Readiness:
    """
    The load's outcome and each listener's latest self-check, read as one
    L{State} with a one-line reason.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        notify: Callable[[bytes], object] = lambda message: None,
    ) -> None:
        """
        @param notify: sends a state line to the service manager
            (L{notifySystemd}).
        """
        self._notify = notify
        self._loaded = False
        self._failure: str | None = None
        # listener: None once passed, "" before its first check, else why not
        self._checks: dict[str, str | None] = {}
        self._everReady = False
        self._announced: tuple[State, str | None] = (State.STARTING, None)
        self._observers: list[Callable[[], None]] = []
        self._waiting: list[Deferred[None]] = []
        self._selfcheck: Gauge | None = None
        if registry is not None:
            Gauge(
                "fleetd_ready",
                "1 once fleetd loaded its runs and completed a TLS handshake"
                " with each of its listeners; 0 while starting, degraded or"
                " after its load failed.",
                registry=registry,
            ).set_function(lambda: 1.0 if self.ready else 0.0)
            self._selfcheck = Gauge(
                "fleetd_listener_selfcheck_ok",
                "1 while fleetd's latest TLS handshake (with ALPN) against its"
                " own listener succeeded; 0 before the first or after a failed one.",
                ["listener"],
                registry=registry,
            )

    @property
    def state(self) -> State:
        if self._failure is not None:
            return State.FAILED
        if not self._loaded:
            return State.STARTING
        if any(reason is not None for reason in self._checks.values()):
            return State.DEGRADED if self._everReady else State.STARTING
        return State.READY

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def reason(self) -> str | None:
        """Why fleetd is not ready, in one line; L{None} when it is."""
        if self._failure is not None:
            return self._failure
        failing = [
            f"listener {name}: {reason}"
            for name, reason in sorted(self._checks.items())
            if reason
        ]
        if failing:
            return "; ".join(failing)[:300]
        if not self._loaded:
            return "loading the runs"
        if any(reason is not None for reason in self._checks.values()):
            return "waiting for the first TLS self-check of each listener"
        return None

    def _failing(self) -> bool:
        """Whether a listener's latest self-check failed (not merely pending)."""
        return any(self._checks.values())

    def expect(self, listeners: Iterable[str]) -> None:
        """Ready only once each of C{listeners} passed a self-check."""
        for name in listeners:
            self._checks[name] = ""
            if self._selfcheck is not None:
                self._selfcheck.labels(name).set_function(self._passed(name))

    def _passed(self, listener: str) -> Callable[[], float]:
        """The gauge's value for C{listener}: 1 while its latest check passed."""
        return lambda: 1.0 if self._checks[listener] is None else 0.0

    def checked(self, listener: str, reason: str | None) -> None:
        """Listener C{listener}'s self-check passed (C{reason} L{None}) or
        failed for C{reason} (one line)."""
        self._checks[listener] = None if reason is None else (reason or "failed")
        self._changed()

    def whenSettled(self, observer: Callable[[], None]) -> None:
        """
        Call C{observer} once the start-up load finished, loaded or failed
        (at once if it already has): work that may wait, such as the
        journal's first verification, stays out of the load's way.
        """
        if self._loaded or self._failure is not None:
            observer()
        else:
            self._observers.append(observer)

    def whenReady(self) -> Deferred[None]:
        """Fire the first time fleetd is ready (at once if it has been)."""
        if self._everReady:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiting.append(d)
        return d

    def loaded(self) -> None:
        """The load finished: fleetd can serve once its listeners can."""
        self._settle(None)

    def failed(self, reason: str) -> None:
        """The load raised C{reason}: fleetd cannot serve until restarted."""
        self._settle(reason)

    def _settle(self, failure: str | None) -> None:
        if self._loaded or self._failure is not None:
            return
        self._loaded, self._failure = failure is None, failure
        observers, self._observers = self._observers, []
        for observer in observers:
            observer()
        self._changed()

    def _changed(self) -> None:
        """Tell the log and the service manager when the state moved, or
        why fleetd is not ready changed."""
        state, reason = self.state, self.reason
        previous, self._announced = self._announced, (state, reason)
        if (state, reason) == previous:
            return
        if state is State.READY:
            again = self._everReady
            self._everReady = True
            log.info("fleetd.ready.again" if again else "fleetd.ready")
            self._notify(b"STATUS=serving" if again else b"READY=1\nSTATUS=serving")
            waiting, self._waiting = self._waiting, []
            for d in waiting:
                d.callback(None)
        elif state is State.DEGRADED:
            if previous[0] is not State.DEGRADED:
                log.warn("fleetd.degraded {reason}", reason=reason)
            self._notify(f"STATUS=degraded: {reason}".encode("utf-8", "replace"))
        elif state is State.STARTING and self._failing():
            self._notify(f"STATUS=starting: {reason}".encode("utf-8", "replace"))
        elif state is State.FAILED:
            self._notify(f"STATUS={reason}".encode("utf-8", "replace"))

    def toJSON(self) -> dict[str, str]:
        """C{{"status": "ok"}}; C{"starting"}, C{"degraded"} or
        C{"failed"} with the reason."""
        state, reason = self.state, self.reason
        if state is State.READY:
            return {"status": "ok"}
        answer = {"status": state.value}
        if reason is not None:
            answer["reason"] = reason
        return answer


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
