"""
Find a partition by its GPT partition name in a disk or a disk image.

UEFI 2.10 section 5.3: the GPT header is at LBA 1 (signature
C{EFI PART}, its own size and CRC32, the partition entry array's LBA,
entry count, entry size and CRC32); a copy of it (the backup) is at the
disk's last LBA. Each entry holds the type GUID (all zeros: unused), the
first and last LBA (inclusive) and a 36-character UTF-16LE name. The
logical sector size is not written anywhere in the table: the header is
looked for at 512 bytes, then at 4096.

Only reads (C{os.pread} on a descriptor the caller opened); the primary
header is used when its CRCs hold, else the backup one.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

SIGNATURE = b"EFI PART"
SECTOR_SIZES = (512, 4096)
# Header fields up to the entry array's CRC32 (92 bytes, UEFI table 5-5).
_HEADER = struct.Struct("<8sIIIIQQQQ16sQIII")
_ENTRY = struct.Struct("<16s16sQQQ72s")
MAX_ENTRIES = 1024
MAX_ENTRY_SIZE = 4096


class GPTError(Exception):
    """One line: why no such partition can be found."""


@dataclass(frozen=True)
class Partition:
    """
    A GPT partition: its byte offset and length on the disk.

    @ivar index: its 1-based number (C{sda1}).
    @ivar sectorSize: the logical sector size the table was found with.
    """

    name: str
    index: int
    offset: int
    length: int
    sectorSize: int


def _header(fd: int, lba: int, sectorSize: int) -> tuple[int, int, int] | None:
    """
    The entry array's LBA, entry count and entry size of the header at
    C{lba}, or C{None} when there is no valid header there.
    """
    raw = os.pread(fd, sectorSize, lba * sectorSize)
    if len(raw) < _HEADER.size or raw[:8] != SIGNATURE:
        return None
    (
        _sig, _rev, headerSize, headerCRC, _res, myLBA, _alt, _first, _last,
        _guid, entriesLBA, count, entrySize, entriesCRC,
    ) = _HEADER.unpack_from(raw)  # fmt: skip
    if not _HEADER.size <= headerSize <= sectorSize or myLBA != lba:
        return None
    check = bytearray(raw[:headerSize])
    check[16:20] = bytes(4)
    if zlib.crc32(check) != headerCRC:
        return None
    if not 0 < count <= MAX_ENTRIES or not 128 <= entrySize <= MAX_ENTRY_SIZE:
        return None
    if entrySize % 8:
        return None
    entries = os.pread(fd, count * entrySize, entriesLBA * sectorSize)
    if len(entries) != count * entrySize or zlib.crc32(entries) != entriesCRC:
        return None
    return entriesLBA, count, entrySize


def _entries(
    fd: int, entriesLBA: int, count: int, entrySize: int, sectorSize: int
) -> list[Partition]:
    raw = os.pread(fd, count * entrySize, entriesLBA * sectorSize)
    found = []
    for index in range(count):
        typeGUID, _uniq, first, last, _attrs, rawName = _ENTRY.unpack_from(
            raw, index * entrySize
        )
        if typeGUID == bytes(16) or last < first:
            continue
        name = rawName.decode("utf-16-le", "replace").split("\x00", 1)[0]
        found.append(
            Partition(
                name=name,
                index=index + 1,
                offset=first * sectorSize,
                length=(last - first + 1) * sectorSize,
                sectorSize=sectorSize,
            )
        )
    return found


def partitions(fd: int) -> list[Partition]:
    """
    The used partitions of the GPT on the disk open as C{fd}.

    @raise GPTError: no valid GPT (neither header at 512- nor 4096-byte
        sectors, primary or backup).
    """
    size = os.lseek(fd, 0, os.SEEK_END)
    for sectorSize in SECTOR_SIZES:
        if size < 3 * sectorSize:
            continue
        last = size // sectorSize - 1
        for lba in (1, last):
            header = _header(fd, lba, sectorSize)
            if header is not None:
                return _entries(fd, *header, sectorSize)
    raise GPTError("no valid GPT partition table")


def findByName(fd: int, name: str) -> Partition:
    """
    The one partition named C{name}, inside the disk.

    @raise GPTError: none, several, or one that lies past the disk's end.
    """
    size = os.lseek(fd, 0, os.SEEK_END)
    named = [p for p in partitions(fd) if p.name == name]
    if not named:
        raise GPTError(f"no partition named {name}")
    if len(named) > 1:
        numbers = ", ".join(str(p.index) for p in named)
        raise GPTError(f"partitions {numbers} are all named {name}")
    (found,) = named
    if found.offset + found.length > size:
        raise GPTError(f"partition {found.index} ({name}) lies past the disk's end")
    return found
