"""
A grpcio client of C{sidero.kms.KMSService} that plays Talos (issue 30):
Seal a passphrase, Unseal its blob, over TLS to the kms listener.

The method paths come from the descriptor generated from the proto
(L{fleetd.kms.proto.kms_pb2}), as grpc's generated stub would name them.

    channel = secureChannel("localhost", port, caPEM)
    kms = KMSClient(channel)
    blob = kms.seal(uuid, passphrase)      # raises grpc.RpcError when refused
    assert kms.unseal(uuid, blob) == passphrase
    channel.close()

The calls block: run them in a thread (C{deferToThread}) from the reactor.
"""

from __future__ import annotations

from typing import Any

import grpc

from fleetd.kms.proto import kms_pb2

SERVICE = kms_pb2.DESCRIPTOR.services_by_name["KMSService"].full_name


def secureChannel(
    host: str,
    port: int,
    rootPEM: bytes,
    *,
    options: list[tuple[str, Any]] | None = None,
) -> grpc.Channel:
    """A TLS channel to C{host:port} trusting C{rootPEM} (ALPN h2), as
    Talos's client dials C{kms.endpoint}."""
    credentials = grpc.ssl_channel_credentials(root_certificates=rootPEM)
    return grpc.secure_channel(f"{host}:{port}", credentials, options=options or [])


class KMSClient:
    """Seal and Unseal, as Talos calls them."""

    def __init__(self, channel: grpc.Channel, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._seal = channel.unary_unary(
            f"/{SERVICE}/Seal",
            request_serializer=kms_pb2.Request.SerializeToString,
            response_deserializer=kms_pb2.Response.FromString,
        )
        self._unseal = channel.unary_unary(
            f"/{SERVICE}/Unseal",
            request_serializer=kms_pb2.Request.SerializeToString,
            response_deserializer=kms_pb2.Response.FromString,
        )

    def seal(self, uuid: str, data: bytes) -> bytes:
        """The sealed blob of C{data}; raise L{grpc.RpcError} when refused."""
        response = self._seal(
            kms_pb2.Request(node_uuid=uuid, data=data), timeout=self.timeout
        )
        return bytes(response.data)

    def unseal(self, uuid: str, data: bytes) -> bytes:
        """The passphrase of blob C{data}; raise L{grpc.RpcError} when refused."""
        response = self._unseal(
            kms_pb2.Request(node_uuid=uuid, data=data), timeout=self.timeout
        )
        return bytes(response.data)
