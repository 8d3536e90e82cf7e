"""
HTTP for C{fleetd-agent}: JSON requests to the device listener over TLS.

A refusal comes back as one line starting with its reason code
(C{ek-binding-not-approved: ...}); L{Refusal} carries it to the command,
which prints it and exits non-zero.
"""

from __future__ import annotations

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


def tlsContext(
    ca: str | None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        context.load_cert_chain(str(cert), None if key is None else str(key))
    return context


def contextSender(context: ssl.SSLContext) -> Send:
    """A L{Send} over Python's TLS with C{context}."""

    def send(method: str, url: str, data: bytes | None) -> tuple[int, bytes]:
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        if data is not None:
            request.add_header("content-type", "application/json")
        try:
            opened = urllib.request.urlopen(request, timeout=TIMEOUT, context=context)  # noqa: S310
            with opened as response:
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
) -> dict[str, Any]:
    """
    POST C{body} (or GET when it is L{None}) and return the JSON answer;
    C{via} is a TLS context or a L{Send} (the TPM key's transport).
    """
    url = server.rstrip("/") + path
    if not url.startswith("https://"):
        raise Unreachable(f"{server}: the device listener is https:// only")
    data = None if body is None else json.dumps(body).encode("utf-8")
    send = contextSender(via) if isinstance(via, ssl.SSLContext) else via
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
