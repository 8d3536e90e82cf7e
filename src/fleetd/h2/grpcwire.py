"""gRPC-over-HTTP/2 wire details shared by the HTTP/2 listener and proxy."""

from __future__ import annotations

import enum


class GRPCStatus(enum.IntEnum):
    """gRPC status codes (grpc/grpc ``doc/statuscodes.md``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def encodeGrpcMessage(message: str) -> bytes:
    """Percent-encode C{message} for ``grpc-message`` (gRPC PROTOCOL-HTTP2):
    UTF-8 bytes outside printable ASCII, and ``%``, become ``%XX``."""
    return b"".join(
        bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
        for b in message.encode("utf-8")
    )


def notGrpc(method: bytes, contentType: bytes) -> list[tuple[bytes, bytes]] | None:
    """The response headers to a request that is not gRPC (like grpc-go's),
    or L{None} for a gRPC request."""
    if method != b"POST":
        status, code, text = b"405", GRPCStatus.INTERNAL, "method must be POST"
    elif not contentType.startswith(b"application/grpc"):
        status, code, text = b"415", GRPCStatus.INVALID_ARGUMENT, "not gRPC"
    else:
        return None
    return [
        (b":status", status),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"%d" % code),
        (b"grpc-message", encodeGrpcMessage(text)),
    ]


class MessageSizeGuard:
    """Track gRPC message prefixes (flag, 4-byte length) across DATA frames,
    whose boundaries are unrelated to message boundaries.

    @ivar messages: how many whole messages went past.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._prefix = bytearray()
        self._remaining = 0
        self.messages = 0

    @property
    def partial(self) -> bool:
        """Whether the bytes so far end inside a message."""
        return bool(self._prefix) or self._remaining > 0

    def feed(self, data: bytes) -> int | None:
        """Return the first declared length over the limit, else L{None}."""
        offset, end = 0, len(data)
        while offset < end:
            if self._remaining:
                step = min(self._remaining, end - offset)
                self._remaining -= step
                offset += step
                if not self._remaining:
                    self.messages += 1
                continue
            need = 5 - len(self._prefix)
            self._prefix += data[offset : offset + need]
            offset += need
            if len(self._prefix) == 5:
                length = int.from_bytes(self._prefix[1:], "big")
                self._prefix.clear()
                if length > self._limit:
                    return length
                self._remaining = length
                if not length:
                    self.messages += 1
        return None
