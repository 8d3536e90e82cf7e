"""
Talos's device-flow fetch (RFC 8628; docs/design.md [F1] [F2]), as
C{talos.config.oauth.*} makes it through golang.org/x/oauth2, from the
node's own loopback address on the boot listener:

  1. C{POST /device/code} with C{client_id} and the extra form fields
     Talos sends (uuid, serial, mac, hostname): a device code, the user
     code the node prints on its console, the interval and the lifetime;
  2. C{POST /token} every C{interval} seconds (x/oauth2's
     C{DeviceAccessToken}): C{authorization_pending} goes on,
     C{slow_down} adds 5 seconds to the interval, anything else ends the
     flow; the wait ends at the request's expiry;
  3. C{GET /config} with C{Authorization: Bearer} on Talos's download
     retry schedule (L{fleetd.sim.talos.fetchConfig}).

The sim scales the polling interval down by its time scale (fleetd then
answers C{slow_down}, which a real Talos meets too); the expiry is the
server's and is not scaled. Device codes, user codes and access tokens
are secrets: used, never kept or printed.

Blocking (http.client): the rack runs it in a thread.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"
CLIENT_ID = "talos"
SLOW_DOWN_STEP = 5  # seconds x/oauth2 adds to the interval on slow_down


class DeviceFlowFailed(Exception):
    """The flow ended without a token (one line, no secret in it)."""


@dataclass(frozen=True)
class Grant:
    """A device authorization response (RFC 8628 section 3.2)."""

    deviceCode: str
    userCode: str
    interval: float
    expiresIn: float

    def __repr__(self) -> str:  # secrets are never printed
        return f"Grant(interval={self.interval}, expiresIn={self.expiresIn})"


@dataclass(frozen=True)
class BootEndpoint:
    """The boot listener as a node reaches it."""

    port: int
    ca: Path
    source: str
    host: str = "localhost"

    def post(self, path: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPSConnection(
            self.host,
            self.port,
            context=ssl.create_default_context(cafile=str(self.ca)),
            timeout=30,
            source_address=(self.source, 0),
        )
        try:
            conn.request(
                "POST",
                path,
                body=urllib.parse.urlencode(form).encode(),
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            response = conn.getresponse()
            status, body = response.status, response.read()
        finally:
            conn.close()
        try:
            document = json.loads(body or b"{}")
        except ValueError:
            document = {}
        return status, document if isinstance(document, dict) else {}


def requestCode(boot: BootEndpoint, reported: dict[str, str]) -> Grant:
    """C{POST /device/code} with the fields the node reports."""
    status, document = boot.post("/device/code", {"client_id": CLIENT_ID, **reported})
    if status != 200:
        raise DeviceFlowFailed(
            f"/device/code: HTTP {status} {document.get('error', '')}".strip()
        )
    return Grant(
        deviceCode=str(document["device_code"]),
        userCode=str(document["user_code"]),
        interval=float(document.get("interval") or 5),
        expiresIn=float(document["expires_in"]),
    )


def awaitToken(
    boot: BootEndpoint,
    grant: Grant,
    timeScale: float,
    stop: threading.Event,
) -> str:
    """
    Poll C{/token} on x/oauth2's schedule (scaled) until the access token,
    an error other than pending or slow_down, the request's expiry, or
    C{stop} (the owner's approval failed).
    """
    form = {"grant_type": GRANT_TYPE, "device_code": grant.deviceCode,
            "client_id": CLIENT_ID}  # fmt: skip
    interval = grant.interval
    deadline = time.monotonic() + grant.expiresIn
    while time.monotonic() < deadline:
        if stop.wait(interval / timeScale):
            raise DeviceFlowFailed("/token: the owner did not approve")
        status, document = boot.post("/token", form)
        if status == 200 and document.get("token_type") == "Bearer":
            return str(document["access_token"])
        error = document.get("error")
        if error == "slow_down":
            interval += SLOW_DOWN_STEP
        elif error != "authorization_pending":
            raise DeviceFlowFailed(f"/token: HTTP {status} {error}")
    raise DeviceFlowFailed("/token: the request expired before its approval")
