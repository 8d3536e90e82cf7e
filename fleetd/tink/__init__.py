"""The tink listener: HTTP/2 (gRPC) in front of tink-server ([A4])."""

from fleetd.tink.h2server import (
    GRPCStatus,
    H2ServerProtocol,
    IStreamHandler,
    StreamResponder,
    TinkListenerFactory,
    UnimplementedHandler,
    encodeGrpcMessage,
)

__all__ = [
    "GRPCStatus",
    "H2ServerProtocol",
    "IStreamHandler",
    "StreamResponder",
    "TinkListenerFactory",
    "UnimplementedHandler",
    "encodeGrpcMessage",
]
