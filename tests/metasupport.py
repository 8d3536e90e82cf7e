"""
Disks for the META tests: sparse image files partitioned by the real
C{sfdisk} (util-linux), laid out as Talos lays out an installed disk
(a 1 MiB partition named C{META}, Talos's C{METASize()} in
C{pkg/machinery/imager/quirks/partitions.go}), and loop devices over them
when C{losetup} works here. C{sfdisk} is a peer C{make test} installs;
a machine that cannot attach loop devices (no privilege, no
C{/dev/loop-control}) skips those tests, saying why, except under
C{make test} (C{FLEETD_REQUIRE_PEERS}), where that is a failure.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from fleetd.agent import main as agent
from tests.support import missingPeer

MiB = 1024 * 1024
# Talos's installed layout (internal/pkg/partition/partition.go): EFI, BIOS,
# BOOT, META (1 MiB), STATE (100 MiB), EPHEMERAL; shrunk but for META.
TALOS_LAYOUT = (
    ("EFI", "4MiB"),
    ("BIOS", "1MiB"),
    ("BOOT", "4MiB"),
    ("META", "1MiB"),
    ("STATE", "4MiB"),
    ("EPHEMERAL", None),
)


def requireSfdisk() -> str:
    path = shutil.which("sfdisk")
    if path is None:
        raise missingPeer("sfdisk (Debian package fdisk) is not installed")
    return path


def partition(
    target: Path | str,
    layout: tuple[tuple[str, str | None], ...] = TALOS_LAYOUT,
) -> None:
    """Write a GPT with C{layout} (name, size or C{None} for the rest)."""
    lines = ["label: gpt"]
    for name, size in layout:
        lines.append(f"size={size}, name={name}" if size else f"name={name}")
    subprocess.run(
        [requireSfdisk(), "--quiet", "--no-reread", "--no-tell-kernel", str(target)],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        capture_output=True,
    )


def makeImage(
    case: SynchronousTestCase,
    size: int = 64 * MiB,
    layout: tuple[tuple[str, str | None], ...] = TALOS_LAYOUT,
) -> Path:
    """A sparse disk image file of C{size} bytes holding C{layout}."""
    path = Path(case.mktemp())
    with path.open("wb") as f:
        f.truncate(size)
    partition(path, layout)
    return path


def sfdiskJSON(target: Path | str) -> dict[str, Any]:
    """sfdisk's own reading of the table (C{--json})."""
    done = subprocess.run(
        [requireSfdisk(), "--json", str(target)],
        check=True,
        capture_output=True,
        text=True,
    )
    table: dict[str, Any] = json.loads(done.stdout)["partitiontable"]
    return table


def metaRange(target: Path | str) -> tuple[int, int]:
    """The META partition's byte offset and length, as sfdisk reads them."""
    table = sfdiskJSON(target)
    sector = int(table.get("sectorsize", 512))
    (meta,) = [p for p in table["partitions"] if p.get("name") == "META"]
    return int(meta["start"]) * sector, int(meta["size"]) * sector


def loopDevice(case: SynchronousTestCase, image: Path, sectorSize: int = 512) -> str:
    """
    A loop device over C{image} with C{sectorSize}-byte logical sectors
    (detached at cleanup). When this machine cannot attach one: a skip on
    a developer's machine, a failure under C{make test} (L{missingPeer}).
    """
    losetup = shutil.which("losetup")
    if losetup is None:
        raise missingPeer("losetup (Debian package mount) is not installed")
    try:
        done = subprocess.run(
            [losetup, "--find", "--show", "--sector-size", str(sectorSize), str(image)],
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as e:
        raise missingPeer(f"losetup cannot attach here: {e.stderr.strip()}") from None
    device = done.stdout.strip()
    case.addCleanup(subprocess.run, [losetup, "--detach", device], check=False)
    return device


def runAgent(*argv: str) -> tuple[int, str, str]:
    """C{fleetd-agent ARGV}: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = agent.main(list(argv), err, out)
    return code, out.getvalue(), err.getvalue()
