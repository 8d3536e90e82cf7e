"""The tink listener: HTTP/2 (gRPC) in front of tink-server ([A4])."""

from fleetd.tink.grpcwire import GRPCStatus, encodeGrpcMessage
from fleetd.tink.h2server import H2ServerProtocol, IStreamHandler, StreamResponder
from fleetd.tink.listener import TinkListenerFactory, UnimplementedHandler

__all__ = [
    "GRPCStatus",
    "H2ServerProtocol",
    "IStreamHandler",
    "StreamResponder",
    "TinkListenerFactory",
    "UnimplementedHandler",
    "encodeGrpcMessage",
]
