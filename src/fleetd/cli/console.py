"""
C{fleetctl console}: a one-time login link to the owner console.

The link opens one browser session for the operator whose certificate
asked for it, with that certificate's role (a reader's session reads and
changes nothing [O4]), once, within minutes (docs/design.md, the owner
console); a browser that presents the certificate needs none. C{--json}:
C{{"url": ..., "expires_at": ...}}.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import IO, Any

from fleetd.cli.client import AdminClient
from fleetd.clitools import writeJSON
from fleetd.config import Settings


def addCommands(commands: Any) -> None:
    console = commands.add_parser(
        "console", help="print a one-time login link to the owner console"
    )
    console.set_defaults(handler=cmdConsole)


def cmdConsole(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    link = AdminClient(settings).request(
        "POST", "/v1/admin/console/login-link", body={}
    )
    if args.json:
        writeJSON(out, {"url": link["url"], "expires_at": link["expires_at"]})
        return 0
    until = datetime.fromtimestamp(link["expires_at"], UTC).strftime("%H:%M:%S UTC")
    out.write(f"{link['url']}\n")
    out.write(f"open it once, before {until}; it signs this browser in as you\n")
    if link.get("role") == "reader":
        out.write("as a reader: the console shows everything and changes nothing\n")
    return 0
