"""
fleetctl: the owner's command-line client for fleetd's admin API.

C{fleetctl [--config FILE] [--json] COMMAND ...}. The config is found from
C{--config}, then C{$FLEETD_CONFIG}, then C{/etc/fleetd/fleetd.toml}; the
owner client certificate and the admin URL come from its C{[owner]} table.

fleetctl connects to the host and port of C{owner.server} but verifies the
certificate for the site's enrollment name (from the topology file): the
admin listener presents the public certificate, which covers that name and
nothing else, so C{https://localhost:8446} works on spore as shipped.
Exit 0 on success; otherwise one line on stderr and a non-zero status.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from fleetd.config import ConfigError, Settings, loadSettings

DEFAULT_CONFIG = "/etc/fleetd/fleetd.toml"


class CLIError(Exception):
    """A failure to report as one line on stderr."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _errorLine(data: bytes) -> str:
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
            reason = getattr(e, "reason", None) or e.__class__.__name__
            raise CLIError(
                f"cannot reach fleetd at https://{self.host}:{self.port}: {reason}"
                f"{': ' + str(e) if str(e) and not reason == str(e) else ''}"
            ) from e
        finally:
            conn.close()
        if not 200 <= response.status < 300:
            raise CLIError(f"fleetd answered {response.status}: {_errorLine(data)}")
        try:
            return json.loads(data)
        except ValueError as e:
            raise CLIError("fleetd answered something that is not JSON") from e


def formatEntry(entry: dict[str, Any]) -> str:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry["at"]))
    parts = [f"{entry['seq']:>6}", at, entry["event"], f"actor={entry['actor']}"]
    for key in ("device", "run"):
        if entry.get(key):
            parts.append(f"{key}={entry[key]}")
    for key, value in sorted((entry.get("fields") or {}).items()):
        parts.append(
            f"{key}={json.dumps(value) if not isinstance(value, str) else value}"
        )
    return "  ".join(parts)


def cmdJournal(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    client = AdminClient(settings)
    if args.action == "verify":
        result = client.request("GET", "/v1/admin/journal/verify")
        if args.json:
            out.write(json.dumps(result) + "\n")
        elif result["ok"]:
            out.write(f"journal OK: {result['entries']} entries, chain intact\n")
        else:
            out.write(f"journal BROKEN at seq {result['seq']}: {result['problem']}\n")
        return 0 if result["ok"] else 1
    if args.action is not None:
        raise CLIError(f"journal: unknown action {args.action!r} (only 'verify')", 2)
    query = {}
    if args.device:
        query["device"] = args.device
    if args.run:
        query["run"] = args.run
    if args.since:
        query["since"] = str(args.since)
    result = client.request("GET", "/v1/admin/journal", query)
    if args.json:
        out.write(json.dumps(result["entries"]) + "\n")
    else:
        for entry in result["entries"]:
            out.write(formatEntry(entry) + "\n")
    return 0


def cmdDNSCheck(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    from fleetd.cli.dnscheck import dnsCheck

    return dnsCheck(
        settings,
        timeout=args.timeout,
        minDays=args.min_days,
        out=out,
        jsonOutput=args.json,
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, status 2
        raise CLIError(f"{self.prog}: {message}", 2)


def buildParser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fleetctl", description="Owner client for fleetd.")
    parser.add_argument("--config", help="fleetd TOML file (env FLEETD_CONFIG)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser
    )

    journal = commands.add_parser("journal", help="show or verify the journal")
    journal.add_argument("action", nargs="?", help="'verify' to check the hash chain")
    journal.add_argument("--device", help="only entries about this device")
    journal.add_argument("--run", help="only entries about this run")
    journal.add_argument("--since", type=int, default=0, help="entries after this seq")
    journal.set_defaults(handler=cmdJournal)

    from fleetd.cli import devices

    devices.addCommands(commands)

    from fleetd.cli import provision

    provision.addCommands(commands)

    from fleetd.cli import approve

    approve.addCommands(commands)

    from fleetd.cli import status

    status.addCommands(commands)

    from fleetd.cli import trust

    trust.addCommands(commands)
    from fleetd.cli import cluster

    cluster.addCommands(commands)

    from fleetd.cli.dnscheck import addArguments

    dns = commands.add_parser(
        "dns-check", help="check anchors, fallback and certificates"
    )
    addArguments(dns)
    dns.set_defaults(handler=cmdDNSCheck)
    return parser


def configPath(given: str | None, environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(given or env.get("FLEETD_CONFIG") or DEFAULT_CONFIG)


def main(
    argv: Sequence[str] | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        args = buildParser().parse_args(argv)
        settings = loadSettings(configPath(args.config))
        handler: Callable[[Settings, argparse.Namespace, IO[str]], int] = args.handler
        return handler(settings, args, out)
    except ConfigError as e:
        err.write(f"fleetctl: configuration error: {e}\n")
        return 2
    except CLIError as e:
        err.write(f"fleetctl: {e}\n" if not str(e).startswith("fleetctl") else f"{e}\n")
        return e.status
    except KeyboardInterrupt:
        err.write("fleetctl: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`fleetctl journal | head`): not an error.
        if out is sys.stdout:  # keep the interpreter's final flush quiet
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            finally:
                os.close(devnull)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
