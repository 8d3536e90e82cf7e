"""
One unary gRPC call of C{sidero.kms.KMSService} on the kms listener.

The request's one message (5-byte gRPC prefix, uncompressed) is read
whole once the client half-closes, decoded as a C{sidero.kms.Request}
and given to the KMS with the connection's source address. The answer is
a C{sidero.kms.Response} and status 0, or Trailers-Only with the gRPC
status of the refusal's reason (L{fleetd.kms.reasons.STATUS}) and a
C{grpc-message} that starts with the reason code: never bytes that look
like a passphrase. A call the KMS does not answer within
C{kms.call_timeout} seconds is answered UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from google.protobuf.message import DecodeError
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from fleetd.h2.grpcwire import GRPCStatus
from fleetd.h2.stream import Headers, StreamResponder
from fleetd.kms.proto import kms_pb2
from fleetd.kms.reasons import SEAL, STATUS, UNSEAL
from fleetd.refused import BUSY, MALFORMED, Refused

SERVICE = kms_pb2.DESCRIPTOR.services_by_name["KMSService"].full_name
PATHS = {f"/{SERVICE}/Seal".encode(): SEAL, f"/{SERVICE}/Unseal".encode(): UNSEAL}
_HEAD: Headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class IKeys(Protocol):
    """What the kms listener asks (L{fleetd.kms.service.DiskKeys})."""

    def seal(self, uuid: str, data: bytes, peer: str) -> Awaitable[bytes]:
        "The sealed blob, or raise L{Refused}."

    def unseal(self, uuid: str, data: bytes, peer: str) -> Awaitable[bytes]:
        "The passphrase, or raise L{Refused}."


def frame(message: bytes) -> bytes:
    """One uncompressed gRPC message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def readRequest(body: bytes) -> kms_pb2.Request:
    """
    The one message of a unary call's body.

    @raise Refused: C{malformed}: compressed, not exactly one message, or
        not a C{Request}.
    """
    if len(body) < 5:
        raise Refused(MALFORMED, "a unary call carries one gRPC message")
    if body[0] != 0:
        raise Refused(MALFORMED, "compressed messages are not accepted")
    length = int.from_bytes(body[1:5], "big")
    if len(body) != 5 + length:
        raise Refused(MALFORMED, "a unary call carries one gRPC message")
    request = kms_pb2.Request()
    try:
        request.ParseFromString(body[5:])
    except DecodeError:
        raise Refused(MALFORMED, "the message is not a sidero.kms.Request") from None
    return request


class KMSCall:
    """One stream's L{fleetd.h2.stream.IStreamHandler}."""

    def __init__(
        self,
        responder: StreamResponder,
        keys: IKeys,
        clock: IReactorTime,
        timeout: float,
        maxMessage: int = 4096,
    ) -> None:
        """
        @param maxMessage: C{kms.max_message_bytes}: the server bounds each
            message, this call the body (one message and its prefix), so a
            stream that keeps sending messages is refused, not buffered.
        """
        self._maxBody = 5 + maxMessage
        self._responder = responder
        self._keys = keys
        self._clock = clock
        self._timeout = timeout
        self._method: str | None = None
        self._body = bytearray()
        self._over = False
        self._timer: IDelayedCall | None = None
        self.log = responder.log

    def headersReceived(self, headers: Headers) -> None:
        path = dict(headers).get(b":path", b"")
        self._method = PATHS.get(path)
        if self._method is None:
            self._status(
                GRPCStatus.UNIMPLEMENTED,
                f"fleetd serves {SERVICE}/Seal and /Unseal only",
            )

    def dataReceived(self, data: bytes) -> None:
        if self._over:
            return
        if len(self._body) + len(data) > self._maxBody:
            self._body.clear()
            self._refused(Refused(MALFORMED, "a unary call carries one gRPC message"))
            return
        self._body += data

    def endReceived(self) -> None:
        if self._over or self._method is None:
            return
        try:
            request = readRequest(bytes(self._body))
        except Refused as refused:
            self._refused(refused)
            return
        self._body.clear()
        ask: Callable[[str, bytes, str], Awaitable[bytes]] = (
            self._keys.seal if self._method == SEAL else self._keys.unseal
        )
        peer = self._responder.peerHost
        self._timer = self._clock.callLater(self._timeout, self._late)
        d = Deferred.fromCoroutine(_await(ask(request.node_uuid, request.data, peer)))
        d.addCallbacks(self._answer, self._failed)

    def reset(self, errorCode: int) -> None:
        self._finish()

    def _answer(self, data: bytes) -> None:
        if self._finish():
            message = kms_pb2.Response(data=data).SerializeToString()
            responder = self._responder
            responder.sendHeaders(_HEAD)
            responder.sendData(frame(message))
            responder.sendTrailers([(b"grpc-status", b"0")])

    def _failed(self, failure: Failure) -> None:
        if failure.check(Refused):
            self._refused(failure.value)  # type: ignore[arg-type]
            return
        self.log.failure("kms.call-failed", failure=failure)
        self._refused(Refused(BUSY, "fleetd could not answer; retry"))

    def _refused(self, refused: Refused) -> None:
        status = GRPCStatus[STATUS.get(refused.reason, "INTERNAL")]
        self._status(status, refused.line())

    def _late(self) -> None:
        self._timer = None
        self._status(GRPCStatus.UNAVAILABLE, "busy: fleetd did not answer in time")

    def _status(self, status: GRPCStatus, message: str) -> None:
        if self._finish():
            self._responder.trailersOnly(status, message)

    def _finish(self) -> bool:
        """End the call once; whether this is that once."""
        if self._over:
            return False
        self._over = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        return True


async def _await(answer: Awaitable[bytes]) -> bytes:
    return await answer
