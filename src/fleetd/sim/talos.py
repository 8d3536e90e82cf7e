"""
Talos's side of delivery: C{GET /config?code=…&uuid=…&serial=…} on the
boot listener, as C{talos.config=} makes it (docs/design.md, who talks to
fleetd), from the node's own loopback address. Talos treats only 200 as
success and retries everything else with exponential backoff, the gaps
growing to about an hour; here the gaps are divided by the sim's time
scale.

Blocking (http.client): the rack runs it in a thread.
"""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

FIRST_GAP = 1.0  # seconds before the first retry, doubled each time
LONGEST_GAP = 3600.0
ATTEMPTS = 8


def gaps(timeScale: float, attempts: int = ATTEMPTS) -> list[float]:
    """The waits between C{attempts} tries, scaled down by C{timeScale}."""
    return [min(FIRST_GAP * 2**n, LONGEST_GAP) / timeScale for n in range(attempts - 1)]


def fetchConfig(
    *,
    port: int,
    ca: Path,
    source: str,
    query: dict[str, str],
    timeScale: float,
    host: str = "localhost",
    bearer: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, bytes]:
    """
    Fetch the machine configuration until a 200 or the last try; the last
    status (0: no answer) and body. The body holds the node's secrets:
    the caller reads what the node would (its bootstrap token) and never
    keeps or prints it. With C{bearer} (a device-flow access token,
    L{fleetd.sim.deviceflow}) it is sent as C{Authorization: Bearer}.
    """
    context = ssl.create_default_context(cafile=str(ca))
    path = "/config" + ("?" + urllib.parse.urlencode(query) if query else "")
    headers = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
    status, body = 0, b""
    for gap in [*gaps(timeScale), None]:
        conn = http.client.HTTPSConnection(
            host, port, context=context, timeout=30, source_address=(source, 0)
        )
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            status, body = 0, b""
        finally:
            conn.close()
        if status == 200 or gap is None:
            return status, body
        sleep(gap)
    return status, body
