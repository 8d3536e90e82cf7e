"""
GPTs that are wrong in one way, for the tests of issue 26 item 5: a
second, 512-byte-sector GPT laid into the first sector of a 4096-byte
sector disk (made by C{sfdisk} in a scratch image, then copied over), and
tables sfdisk wrote edited in place with their CRC32s made good again, so
that each is valid and wrong only where the test says.

Writes go through the path given: for a loop device that is its node, so
the kernel's page cache of the device sees them.
"""

from __future__ import annotations

import os
import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tests.metasupport import MiB, loopDevice, partition, requireSfdisk

# UEFI table 5-5: the header's fields up to the entry array's CRC32.
HEADER = struct.Struct("<8sIIIIQQQQ16sQIII")
ENTRY = struct.Struct("<16s16sQQQ72s")
PRIMARY, BACKUP = "primary", "backup"

EntryEdit = Callable[[bytearray, int], None]
HeaderEdit = Callable[[bytearray], None]


def loop4Kn(case: SynchronousTestCase, size: int = 64 * MiB) -> str:
    """A 4096-byte-sector loop device holding Talos's layout (sfdisk)."""
    image = Path(case.mktemp())
    with image.open("wb") as f:
        f.truncate(size)
    device = loopDevice(case, image, 4096)
    partition(device)
    return device


def overlay512(case: SynchronousTestCase, device: str, metaAt: int) -> None:
    """
    Lay a whole, valid GPT for 512-byte sectors over the 4096-byte-sector
    one on C{device}: its primary header and 4 entries in the disk's first
    sector (bytes 512-1535, after the protective MBR), its backup header
    and entries in the disk's last sector (bytes -1024 to the end, after
    the real backup header). Its one partition, C{META}, is 1 MiB at byte
    C{metaAt}. sfdisk makes it in a scratch image of the same size.
    """
    fd = os.open(device, os.O_RDWR)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        scratch = Path(case.mktemp())
        with scratch.open("wb") as f:
            f.truncate(size)
        subprocess.run(
            [requireSfdisk(), "--quiet", str(scratch)],
            input=f"label: gpt\ntable-length: 4\nstart={metaAt // 512},"
            f" size={MiB // 512}, name=META\n",
            text=True,
            check=True,
            capture_output=True,
        )
        crafted = scratch.read_bytes()
        os.pwrite(fd, crafted[512:1536], 512)
        os.pwrite(fd, crafted[-1024:], size - 1024)
        os.fsync(fd)
    finally:
        os.close(fd)


def editTable(
    target: Path | str,
    sectorSize: int = 512,
    entries: EntryEdit | None = None,
    header: HeaderEdit | None = None,
    which: tuple[str, ...] = (PRIMARY, BACKUP),
) -> None:
    """
    Edit the entry array (C{entries(array, entrySize)}) and then the
    header (C{header(sector)}) of the primary and/or backup GPT header on
    C{target}, and write both back with their CRC32s recomputed.
    """
    fd = os.open(target, os.O_RDWR)
    try:
        lastLBA = os.lseek(fd, 0, os.SEEK_END) // sectorSize - 1
        places = {PRIMARY: 1, BACKUP: lastLBA}
        for name in which:
            lba = places[name]
            sector = bytearray(os.pread(fd, sectorSize, lba * sectorSize))
            fields = HEADER.unpack_from(sector)
            headerSize, entriesLBA, count, entrySize = (
                fields[2], fields[10], fields[11], fields[12],
            )  # fmt: skip
            array = bytearray(os.pread(fd, count * entrySize, entriesLBA * sectorSize))
            if entries is not None:
                entries(array, entrySize)
                os.pwrite(fd, bytes(array), entriesLBA * sectorSize)
            struct.pack_into("<I", sector, 88, zlib.crc32(array))
            if header is not None:
                header(sector)
            struct.pack_into("<I", sector, 16, 0)
            struct.pack_into("<I", sector, 16, zlib.crc32(sector[:headerSize]))
            os.pwrite(fd, bytes(sector), lba * sectorSize)
        os.fsync(fd)
    finally:
        os.close(fd)


def entryRange(name: str, first: int, last: int) -> EntryEdit:
    """An entry edit: the partition named C{name} now spans C{first}-C{last}."""

    def edit(array: bytearray, entrySize: int) -> None:
        for offset in range(0, len(array), entrySize):
            rawName = ENTRY.unpack_from(array, offset)[5]
            if rawName.decode("utf-16-le").rstrip("\x00") == name:
                struct.pack_into("<QQ", array, offset + 32, first, last)
                return
        raise AssertionError(f"no entry named {name}")

    return edit


def entryName(old: str, new: str) -> EntryEdit:
    """An entry edit: the partition named C{old} is renamed C{new}."""

    def edit(array: bytearray, entrySize: int) -> None:
        for offset in range(0, len(array), entrySize):
            rawName = ENTRY.unpack_from(array, offset)[5]
            if rawName.decode("utf-16-le").rstrip("\x00") == old:
                array[offset + 56 : offset + 128] = new.encode("utf-16-le").ljust(
                    72, b"\0"
                )
                return
        raise AssertionError(f"no entry named {old}")

    return edit


def headerField(offset: int, value: bytes) -> HeaderEdit:
    """A header edit: C{value} at byte C{offset} of the header."""

    def edit(sector: bytearray) -> None:
        sector[offset : offset + len(value)] = value

    return edit


def byteRange(target: Path | str, name: str, sectorSize: int = 512) -> tuple[int, int]:
    """The byte offset and length of the partition named C{name}."""
    first, last = lbaRange(target, name, sectorSize)
    return first * sectorSize, (last - first + 1) * sectorSize


def backingFile(device: str) -> Path:
    """The image file a loop device reads."""
    done = subprocess.run(
        ["losetup", "--noheadings", "--output", "BACK-FILE", device],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(done.stdout.strip())


def lbaRange(target: Path | str, name: str, sectorSize: int = 512) -> tuple[int, int]:
    """The first and last LBA of the partition named C{name} (primary)."""
    fd = os.open(target, os.O_RDONLY)
    try:
        fields = HEADER.unpack_from(os.pread(fd, sectorSize, sectorSize))
        entriesLBA, count, entrySize = fields[10], fields[11], fields[12]
        array = os.pread(fd, count * entrySize, entriesLBA * sectorSize)
    finally:
        os.close(fd)
    for offset in range(0, len(array), entrySize):
        _type, _uniq, first, last, _attrs, rawName = ENTRY.unpack_from(array, offset)
        if rawName.decode("utf-16-le").rstrip("\x00") == name:
            return first, last
    raise AssertionError(f"no entry named {name}")
