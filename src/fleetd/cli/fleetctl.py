"""
fleetctl: the owner's command-line client for fleetd's admin API.

C{fleetctl [--config FILE] [--json] COMMAND ... [--json]}: C{--json} is
taken before or after the command, at any depth. The config is found from
C{--config}, then C{$FLEETD_CONFIG}, then C{/etc/fleetd/fleetd.toml}; the
owner client certificate and the admin URL come from its C{[owner]} table
(L{fleetd.cli.client}). Exit 0 on success; otherwise one line on stderr
and a non-zero status (L{fleetd.clitools.runMain}); with C{--json}, the
failure is also one JSON object on stdout (L{fleetd.clitools.errorDocument}),
and an unknown device name gets the inventory's closest names
(L{fleetd.cli.names}).

This module is the entry point only: each subcommand module registers its
commands here and imports the client and output modules below it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from fleetd.cli import (
    approve,
    backup,
    cluster,
    console,
    devices,
    dnscheck,
    journal,
    names,
    provision,
    status,
    trust,
)
from fleetd.cli.client import AdminError
from fleetd.cli.output import Console
from fleetd.clitools import (
    CLIError,
    Parser,
    acceptJSONAnywhere,
    addJSONOption,
    runMain,
)
from fleetd.config import ConfigError, Settings, loadSettings

DEFAULT_CONFIG = "/etc/fleetd/fleetd.toml"

Handler = Callable[[Settings, argparse.Namespace, IO[str]], int]


def buildParser() -> argparse.ArgumentParser:
    parser = Parser(prog="fleetctl", description="Owner client for fleetd.")
    parser.add_argument("--config", help="fleetd TOML file (env FLEETD_CONFIG)")
    addJSONOption(parser)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in (journal, devices, provision, approve, status, trust, cluster):
        module.addCommands(commands)
    dnscheck.addCommands(commands)
    backup.addCommands(commands)
    console.addCommands(commands)
    acceptJSONAnywhere(parser)
    return parser


def configPath(given: str | None, environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(given or env.get("FLEETD_CONFIG") or DEFAULT_CONFIG)


def asksForJSON(argv: Sequence[str]) -> bool:
    """
    Whether C{argv} asks for C{--json} (before a C{--}): what decides how
    a mistake in C{argv} itself is reported, before it is parsed.
    """
    words = list(argv)
    end = words.index("--") if "--" in words else len(words)
    return "--json" in words[:end]


def main(
    argv: Sequence[str] | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    stdin: IO[str] | None = None,
) -> int:
    """
    Run fleetctl; C{stdin} and C{err} are where a command asks a person to
    confirm (C{retire} at a terminal), as C{args.console}.
    """
    output = sys.stdout if out is None else out
    errors = sys.stderr if err is None else err
    words = sys.argv[1:] if argv is None else list(argv)
    asked = argparse.Namespace(json=asksForJSON(words))

    def run() -> int:
        try:
            args = buildParser().parse_args(words)
            asked.json = bool(args.json)
            args.console = Console(sys.stdin if stdin is None else stdin, errors)
            settings = loadSettings(configPath(args.config))
            return runCommand(settings, args, output)
        except ConfigError as e:
            raise CLIError(f"configuration error: {e}", 2) from e

    return runMain("fleetctl", run, output, errors, jsonErrors=lambda: asked.json)


def runCommand(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    """
    Run the command C{args} names; fleetd's refusal of a device name it
    does not know gets the inventory's closest names (L{names.suggest}).
    """
    handler: Handler = args.handler
    try:
        return handler(settings, args, out)
    except AdminError as e:
        listNames = names.inventoryNames(settings)
        better = names.suggest(e, names.namesGiven(args), listNames)
        if better is e:
            raise
        raise better from None


if __name__ == "__main__":
    raise SystemExit(main())
