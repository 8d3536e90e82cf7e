"""
HTTP for C{fleetd-agent}: JSON requests to the device listener over TLS.

A refusal comes back as one line starting with its reason code
(C{ek-binding-not-approved: ...}); L{Refusal} carries it to the command,
which prints it and exits non-zero.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

TIMEOUT = 30.0

# Make one request: (method, url, body or None) -> (HTTP status, body).
# Raises L{Unreachable} when there is no answer.
Send = Callable[[str, str, bytes | None], tuple[int, bytes]]


class Refusal(Exception):
    """fleetd said no: HTTP status and the reason line."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(line)
        self.status = status
        self.line = line
        self.reason = line.split(":", 1)[0].strip() or "refused"


class Unreachable(Exception):
    """No answer from fleetd (connection, TLS)."""


def sourceAddress(value: str) -> str:
    """
    C{--source}: the local address the agent connects from (a node with
    several interfaces); an IP literal, as the kernel binds it.
    """
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValueError(f"--source must be an IP address, not {value!r}") from None


class SourceHTTPSHandler(urllib.request.HTTPSHandler):
    """urllib's HTTPS with C{context}, each connection bound to C{source}
    (L{None}: the kernel chooses, as without C{--source})."""

    def __init__(self, context: ssl.SSLContext, source: str | None) -> None:
        super().__init__(context=context)
        self.tls = context
        self.source = source

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        bound = None if self.source is None else (self.source, 0)
        connect = functools.partial(http.client.HTTPSConnection, source_address=bound)
        return self.do_open(connect, req, context=self.tls)


def openURL(
    request: urllib.request.Request, context: ssl.SSLContext, source: str | None
) -> http.client.HTTPResponse:
    """C{urlopen} over TLS with C{context}, from C{source} if given."""
    opener = urllib.request.build_opener(SourceHTTPSHandler(context, source))
    response: http.client.HTTPResponse = opener.open(request, timeout=TIMEOUT)
    return response


def tlsContext(
    ca: str | None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        context.load_cert_chain(str(cert), None if key is None else str(key))
    return context


def contextSender(context: ssl.SSLContext, source: str | None = None) -> Send:
    """A L{Send} over Python's TLS with C{context}, from C{source}."""

    def send(method: str, url: str, data: bytes | None) -> tuple[int, bytes]:
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        if data is not None:
            request.add_header("content-type", "application/json")
        try:
            with openURL(request, context, source) as response:
                return response.status, response.read(1 << 20)
        except urllib.error.HTTPError as e:
            return e.code, e.read(1024)
        except (urllib.error.URLError, ssl.SSLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise Unreachable(f"{url}: {reason}") from e

    return send


def call(
    server: str,
    path: str,
    via: ssl.SSLContext | Send,
    body: dict[str, Any] | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """
    POST C{body} (or GET when it is L{None}) and return the JSON answer;
    C{via} is a TLS context (connecting from C{source}, if given) or a
    L{Send} (the TPM key's transport, bound to its own source).
    """
    url = server.rstrip("/") + path
    if not url.startswith("https://"):
        raise Unreachable(f"{server}: the device listener is https:// only")
    data = None if body is None else json.dumps(body).encode("utf-8")
    send = contextSender(via, source) if isinstance(via, ssl.SSLContext) else via
    status, answer = send("GET" if body is None else "POST", url, data)
    if status >= 400:
        line = answer[:1024].decode("utf-8", "replace").strip().splitlines()
        raise Refusal(status, line[0] if line else f"HTTP {status}")
    try:
        doc = json.loads(answer)
    except ValueError as e:
        raise Unreachable(f"{url}: answer is not JSON") from e
    if not isinstance(doc, dict):
        raise Unreachable(f"{url}: answer is not a JSON object")
    return doc
