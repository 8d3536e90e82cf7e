"""
Hostile input on the boot listener over real TLS: 4xx or a closed
connection, never a 500, a traceback or a stalled reactor.
"""

from __future__ import annotations

import socket
import ssl

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.daemonsupport import UUID1, DeliveryMixin, configPath


def exchange(port: int, ca: str, data: bytes, timeout: float = 15.0) -> bytes:
    """Send raw bytes over TLS; return what came back before the close."""
    context = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            try:
                tls.sendall(data)
            except OSError:
                pass
            chunks = []
            try:
                while chunk := tls.recv(65536):
                    chunks.append(chunk)
            except (OSError, ssl.SSLError):
                pass
            return b"".join(chunks)


FORM = b"application/x-www-form-urlencoded"


def post(path: bytes, body: bytes, ctype: bytes = FORM) -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        b"Content-Type: " + ctype + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body


def get(target: bytes, *headers: bytes) -> bytes:
    extra = b"".join(h + b"\r\n" for h in headers)
    return (
        b"GET "
        + target
        + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        + extra
        + b"\r\n"
    )


CASES = {
    "oversized URL": get(b"/config?code=" + b"A" * 20000),
    "oversized header": get(b"/config", b"X-Big: " + b"a" * 20000),
    "too many headers": get(b"/config", *[b"X-%d: y" % i for i in range(200)]),
    "oversized body": post(b"/token", b"a=" + b"b" * 200000),
    "invalid UTF-8 in query": get(b"/config?code=%ff%fe&uuid=" + UUID1.encode()),
    "raw invalid bytes in target": get(b"/config?code=\xff\xfe"),
    "bad percent-encoding": get(b"/config?code=%zz%&uuid=%&serial=%%"),
    "repeated parameters": get(b"/config?code=a&code=b&uuid=u&serial=s"),
    "NUL in query": get(b"/config?code=%00%00&uuid=%00&serial=%00"),
    "malformed form on /device/code": post(b"/device/code", b"%zz=&&=&client_id"),
    "invalid UTF-8 form on /token": post(b"/token", b"grant_type=%ff&device_code=%fe"),
    "form repeated fields": post(b"/token", b"device_code=a&device_code=b"),
    "JSON body on /token": post(b"/token", b'{"a": 1}', b"application/json"),
    "wrong method": b"DELETE /config HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "not HTTP": b"\x16\x03\x01\x00\x05hello\r\n\r\n",
    "HTTP/0.9": b"GET /config\r\n\r\n",
    "chunked garbage": b"POST /token HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    "absolute URI": get(b"https://evil.example/config"),
    "path traversal": get(b"/../../etc/passwd"),
    "metrics": get(b"/metrics"),
}


class HostileInputTests(DeliveryMixin, TestCase):
    timeout = 180

    def setUp(self) -> Deferred[None]:  # type: ignore[override]
        return self.startLoaded(
            {
                "boot": {"failure_burst": 1000},
                "limits": {"request_timeout": 2, "idle_timeout": 5},
            }
        )

    async def test_hostileInput_4xxOrClosed(self) -> None:
        """
        Oversized URLs, headers and bodies, invalid UTF-8 and percent-encoding,
        repeated parameters, malformed forms, slow clients: 4xx or a close.
        """
        await self.addDevice("w1", "SER1", UUID1)
        codes = await self.provision("w1")
        port = self.port(self.service, "boot")
        ca = str(self.pki.public_ca)
        for name, data in CASES.items():
            answer = await deferToThread(exchange, port, ca, data)
            if answer:
                line = answer.split(b"\r\n", 1)[0]
                self.assertRegex(line, rb"^HTTP/1\.[01] 4\d\d ", name)
            self.assertNotIn(b"Traceback", answer, name)
            self.assertNotIn(b"<html", answer.lower(), name)
        # A client that never finishes its request is cut off (request deadline).
        slow = await deferToThread(exchange, port, ca, b"GET /config?code=", 20.0)
        self.assertEqual(slow, b"")
        # The reactor is not stalled and nothing was consumed: the node still
        # gets its configuration.
        code, _, config = await self.fetch(configPath(codes["w1"], UUID1, "SER1"))
        self.assertEqual(code, 200)
        self.assertIn(b"hostname: w1", config)
        self.assertEqual(self.flushLoggedErrors(), [])
