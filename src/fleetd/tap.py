"""
twistd plugin wiring: C{twistd -n fleetd --config FILE}.

Only wires: options, settings, L{fleetd.service.prepare}, the service.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import NoReturn

from twisted.application.service import IService
from twisted.python import usage

from fleetd.config import ConfigError, loadSettings
from fleetd.logs import FORMATS

DEFAULT_CONFIG = "/etc/fleetd/fleetd.toml"


class Options(usage.Options):
    synopsis = "[--config FILE] [--log-format text|json]"
    longdesc = (
        "Enroll and provision bare-metal Talos Linux nodes: boot, device, "
        "admin, tink and DNS listeners on one reactor."
    )
    optParameters = [
        [
            "config",
            "c",
            os.environ.get("FLEETD_CONFIG", DEFAULT_CONFIG),
            "fleetd TOML configuration file (env FLEETD_CONFIG).",
        ],
        ["log-format", None, "text", "Log line format: text or json (journald)."],
    ]

    def postOptions(self) -> None:
        if self["log-format"] not in FORMATS:
            raise usage.UsageError("--log-format must be text or json")


def _fail(message: str) -> SystemExit:
    # Once twistd has begun logging, sys.stderr feeds the log; the operator
    # still gets the one line on the process's real stderr.
    err = sys.__stderr__ or sys.stderr
    err.write(f"fleetd: {message}\n")
    err.flush()
    return SystemExit(2)


def _fatal(message: str) -> NoReturn:
    raise _fail(message)


def makeService(options: Options) -> IService:
    from twisted.internet import reactor

    from fleetd.reactors import fleetdReactor
    from fleetd.service import FleetdService, prepare

    try:
        settings = loadSettings(Path(options["config"]))
        prepared = prepare(settings)
        # [kubernetes] files (CA, token, client certificate) are read here.
        service = FleetdService(
            prepared,
            fleetdReactor(reactor),
            logFormat=options["log-format"],
            logOutput=sys.stdout,
            handleSignals=True,
            onStartupError=_fatal,
            collector=gc,
        )
    except ConfigError as e:
        raise _fail(f"configuration error: {e}") from None
    return service
