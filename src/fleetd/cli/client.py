"""
fleetctl's HTTPS client for C{/v1/admin/*}, with the owner certificate.

fleetctl connects to the host and port of C{owner.server} but verifies the
certificate for the site's enrollment name (from the topology file): the
admin listener presents the public certificate, which covers that name and
nothing else, so C{https://localhost:8446} works on spore as shipped.
Every failure is a L{CLIError} carrying fleetd's one line; a refusal by
fleetd is an L{AdminError}, which also carries the HTTP status.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

from fleetd.clitools import CLIError
from fleetd.config import Settings

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH: the chain verified, the name did not.
HOSTNAME_MISMATCH = 62


def errorLine(data: bytes) -> str:
    """The first line of an error body, or its JSON C{error} member."""
    text = data.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        text = doc["error"]
    lines = text.splitlines()
    return lines[0] if lines else ""


class AdminError(CLIError):
    """
    fleetd answered, and refused: C{fleetd answered STATUS: LINE}, exit 1.
    With C{--json} the HTTP status is the document's C{http_status}.

    @ivar httpStatus: the HTTP status of fleetd's answer.
    @ivar line: fleetd's one line (L{errorLine}).
    """

    def __init__(
        self,
        httpStatus: int,
        line: str,
        *,
        hint: str = "",
        fields: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            f"fleetd answered {httpStatus}: {line}{hint}",
            fields={"http_status": httpStatus, **(fields or {})},
        )
        self.httpStatus = httpStatus
        self.line = line


def refused(status: int, data: bytes) -> AdminError:
    """The L{AdminError} for a non-2xx answer with body C{data}."""
    return AdminError(status, errorLine(data))


def unreachable(client: AdminClient, e: Exception, what: str = "") -> CLIError:
    """One line for a request that did not reach fleetd or broke off."""
    reason = client.failure(e)
    where = f"https://{client.host}:{client.port}"
    if what:
        return CLIError(f"{what}: cannot fetch from {where}: {reason}")
    return CLIError(f"cannot reach fleetd at {where}: {reason}")


class _Connection(http.client.HTTPSConnection):
    """HTTPS to C{host}, with SNI and certificate checks for C{serverName}."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        serverName: str,
        context: ssl.SSLContext,
        timeout: float,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._serverName = serverName
        self._tlsContext = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tlsContext.wrap_socket(
            self.sock, server_hostname=self._serverName
        )


class AdminClient:
    """
    A small synchronous HTTPS client for C{/v1/admin/*} with the owner cert.

    It connects to C{owner.server}'s host and port and verifies the
    certificate for the enrollment name (L{serverName}).
    """

    def __init__(self, settings: Settings, timeout: float = 10.0) -> None:
        owner = settings.owner
        url = urllib.parse.urlsplit(owner.server)
        if url.scheme != "https" or not url.hostname:
            raise CLIError(
                f"owner.server: must be an https:// URL, not {owner.server!r}"
            )
        self.host = url.hostname
        self.port = url.port or 443
        self.serverName = settings.topology.enrollment_name
        self.serverCA = owner.server_ca
        self.timeout = timeout
        context = ssl.create_default_context(
            cafile=None if owner.server_ca is None else str(owner.server_ca)
        )
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if owner.client_cert is None or owner.client_key is None:
            raise CLIError(
                "owner.client_cert and owner.client_key are needed by fleetctl"
            )
        try:
            context.load_cert_chain(str(owner.client_cert), str(owner.client_key))
        except (OSError, ssl.SSLError) as e:
            raise CLIError(
                f"owner.client_cert: cannot load {owner.client_cert}: {e}"
            ) from e
        self.context = context

    def failure(self, e: Exception) -> str:
        """
        Why a request did not reach fleetd, in a few words. A certificate
        that did not verify names the CA it was verified with and the key
        that holds it (C{owner.server_ca}, or the system roots when that
        is not set), and the name it was verified for when it is not the
        certificate's.
        """
        if isinstance(e, ssl.SSLCertVerificationError):
            ca = (
                "the system roots (owner.server_ca is not set)"
                if self.serverCA is None
                else f"owner.server_ca ({self.serverCA})"
            )
            why = e.verify_message or "certificate verify failed"
            if e.verify_code == HOSTNAME_MISMATCH:
                why = (
                    f"it is not for {self.serverName} (the topology's enrollment_name)"
                )
            return f"its certificate did not verify with {ca}: {why}"
        reason = getattr(e, "reason", None) or e.__class__.__name__
        text = str(e)
        return f"{reason}: {text}" if text and text != reason else str(reason)

    def connection(self) -> http.client.HTTPSConnection:
        """A new connection to the admin listener (not yet connected)."""
        return _Connection(
            self.host,
            self.port,
            serverName=self.serverName,
            context=self.context,
            timeout=self.timeout,
        )

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        """Send one request; return the decoded JSON body of a 2xx answer."""
        if query:
            path += "?" + urllib.parse.urlencode(query)
        payload = None if body is None else json.dumps(body).encode("utf-8")
        conn = self.connection()
        try:
            headers = {"accept": "application/json"}
            if payload is not None:
                headers["content-type"] = "application/json"
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read(16 << 20)
        except (OSError, http.client.HTTPException) as e:
            raise unreachable(self, e) from e
        finally:
            conn.close()
        if not 200 <= response.status < 300:
            raise refused(response.status, data)
        try:
            return json.loads(data)
        except ValueError as e:
            raise CLIError("fleetd answered something that is not JSON") from e


def postText(client: AdminClient, path: str, text: str, contentType: str) -> Any:
    """
    POST a non-JSON body (L{AdminClient.request} sends only JSON); return
    the decoded JSON answer, or raise L{CLIError} with fleetd's line.
    """
    payload = text.encode("utf-8")
    conn = client.connection()
    try:
        headers = {"accept": "application/json", "content-type": contentType}
        conn.request("POST", path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read(16 << 20)
    except (OSError, http.client.HTTPException) as e:
        raise unreachable(client, e) from e
    finally:
        conn.close()
    if not 200 <= response.status < 300:
        raise refused(response.status, data)
    try:
        return json.loads(data)
    except ValueError as e:
        raise CLIError("fleetd answered something that is not JSON") from e


def readUpload(path: Path, limit: int, command: str) -> str:
    """
    The UTF-8 text of a file to import, at most C{limit} bytes; otherwise
    one line naming C{command} and the file.
    """
    try:
        with path.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise CLIError(f"{command}: cannot read {path}: {e.strerror}") from e
    if len(raw) > limit:
        raise CLIError(f"{command}: {path} is larger than {limit} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"{command}: {path}: not UTF-8 (byte {e.start})") from e
