"""
The kms listener's service: the HTTP/2 server of the tink listener
(L{fleetd.h2.listener.TinkListenerFactory}, with the abuse limits of
C{[tink]}: streams per connection and per source, the wasted-stream
budget, header and handshake deadlines) whose streams are L{KMSCall}s,
and its graceful stop: GOAWAY, the calls in flight answered, then the
port (as the tink proxy's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.interfaces import IReactorTime

from fleetd.config import KMSSettings, TinkSettings
from fleetd.h2.guard import H2Limits
from fleetd.h2.listener import TinkListenerFactory
from fleetd.h2.stream import IStreamHandler, StreamResponder
from fleetd.kmsgrpc.call import IKeys, KMSCall
from fleetd.logs import ThrottledLog


def kmsFactory(
    clock: IReactorTime,
    keys: IKeys,
    settings: KMSSettings,
    tink: TinkSettings,
    *,
    idleTimeout: float,
    registry: CollectorRegistry | None = None,
) -> TinkListenerFactory:
    """The kms listener's HTTP/2 factory: the tink listener's limits,
    the KMS's own message bound."""
    abuse = Counter(
        "fleetd_kms_abuse_total",
        "HTTP/2 abuse seen on the kms listener, by kind (as the tink listener's).",
        ["kind"],
        registry=registry,
    )

    def handler(responder: StreamResponder) -> IStreamHandler:
        return KMSCall(
            responder, keys, clock, settings.call_timeout, settings.max_message_bytes
        )

    return TinkListenerFactory(
        clock,
        handlerFactory=handler,
        log=KMSLog(clock),
        maxConcurrentStreams=tink.max_concurrent_streams,
        maxHeaderListSize=tink.max_header_list_size,
        maxMessageBytes=settings.max_message_bytes,
        idleTimeout=idleTimeout,
        streamTimeout=max(settings.call_timeout * 2, 30.0),
        handshakeTimeout=tink.handshake_timeout,
        drainTimeout=tink.drain_timeout,
        limits=H2Limits(streamBudget=tink.stream_budget),
        sourceStreamRate=tink.source_stream_rate,
        sourceStreamBurst=tink.source_stream_burst,
        countAbuse=lambda kind: abuse.labels(kind).inc(),
    )


TINK = "tink."


class KMSLog(ThrottledLog):
    """
    The shared HTTP/2 server's lines (named for the tink listener, whose
    server it is) named for the kms listener instead: an operator reading
    C{kms.connected} or C{kms.h2.idle-timeout} knows which port it was.
    """

    def _emit(self, method: Callable[..., None], format: str, fields: Any) -> None:
        if format.startswith(TINK):
            format = "kms." + format[len(TINK) :]
        super()._emit(method, format, fields)


class KMSListener(MultiService):
    """Holds the kms listener's service (its child) and drains it on stop."""

    def __init__(self, factory: TinkListenerFactory) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.factory = factory

    def stopService(self) -> Deferred[Any]:
        Service.stopService(self)
        listeners = list(self)

        def stopListeners(_: object) -> Deferred[Any]:
            stopping = [maybeDeferred(s.stopService) for s in reversed(listeners)]
            return DeferredList(stopping, consumeErrors=True)

        return self.factory.drain().addBoth(stopListeners)
