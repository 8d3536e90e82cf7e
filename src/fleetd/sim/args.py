"""
C{fleetd-sim}'s command line (L{fleetd.sim.command}): what it reads and
what it refuses before anything starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fleetd.sim.faults import FAULTS, FaultSpecError, parseFaults


def parseArgs(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fleetd-sim", description="A rack of virtual nodes against fleetd."
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="a running fleetd's config (default: start one of its own)",
    )
    parser.add_argument("--nodes", type=int, required=True, help="how many nodes")
    parser.add_argument(
        "--parallel", type=int, default=4, help="nodes on their way at once"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=60.0,
        help="Talos's retry gaps divided by this (default 60)",
    )
    parser.add_argument(
        "--faults",
        metavar="NAME[:COUNT],...",
        help="faults for the rack's first nodes (" + ", ".join(sorted(FAULTS)) + ")",
    )
    parser.add_argument(
        "--fetch",
        choices=("code", "device-flow"),
        default="code",
        help="how each node's Talos fetches its configuration: its one-time"
        " code (default) or RFC 8628's device flow, approved by the sim as owner",
    )
    parser.add_argument(
        "--inventory",
        choices=("sqlite", "netbox"),
        default="sqlite",
        help="the sim's own fleetd's inventory: its embedded one (default) or"
        " the NetBox fake, where the sim enters each node as an operator would",
    )
    parser.add_argument(
        "--disk-encryption",
        action="store_true",
        help="STATE and EPHEMERAL encrypted with fleetd as the KMS its"
        " configuration names: each node seals at install and unseals at a"
        " reboot (fleetd needs [kms] and the nodes' class, worker, opted in)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= 60000 or args.parallel < 1 or args.time_scale <= 0:
        parser.error("--nodes 1..60000, --parallel >= 1, --time-scale > 0")
    try:
        args.faultNames = parseFaults(args.faults)
    except FaultSpecError as e:
        parser.error(str(e))
    if len(args.faultNames) > args.nodes:
        parser.error(f"--faults: {len(args.faultNames)} faults for {args.nodes} nodes")
    if args.config is not None:
        own = sorted({n for n in args.faultNames if FAULTS[n].ownFleetd})
        if own:
            parser.error(f"--faults: {', '.join(own)} only on the sim's own fleetd")
        if args.inventory != "sqlite":
            parser.error("--inventory: only on the sim's own fleetd")
    return args
