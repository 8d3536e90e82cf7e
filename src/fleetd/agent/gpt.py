"""
Find a partition by its GPT partition name in a disk or a disk image.

UEFI 2.10 section 5.3: the GPT header is at LBA 1 (signature
C{EFI PART}, its own size and CRC32, its own and the other header's LBA,
the first and last usable LBA, the disk GUID, the partition entry array's
LBA, entry count, entry size and CRC32); a copy of it (the backup) is at
the LBA the primary names, the disk's last one unless the disk is larger
than the image that was written to it. Each entry holds the type GUID
(all zeros: unused), the first and last LBA (inclusive) and a
36-character UTF-16LE name.

The logical sector size is not written anywhere in the table. It is the
disk's own (C{BLKSSZGET}, as the kernel reads the table); a disk image
file has none and is read with 512-byte sectors unless the caller says
otherwise. Nothing is looked for at another size: a table for 512-byte
sectors can sit in the first and last 4096 bytes of a 4096-byte-sector
disk, beside the real one, and is not the table the kernel and Talos
read (issue 26, item 5).

The primary header and the backup must both be valid and agree; the
partition found must lie inside the disk's usable LBAs and overlap no
other partition. Only reads (C{os.pread} on a descriptor the caller
opened).
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import zlib
from dataclasses import dataclass

SIGNATURE = b"EFI PART"
# linux/fs.h: _IO(0x12, 104), the logical block size as an int.
BLKSSZGET = 0x1268
# What a disk image file is read with: the size losetup, QEMU and the
# Talos images assume.
IMAGE_SECTOR_SIZE = 512
# Sizes a header is looked for at when there is none at the disk's own,
# only to say so.
OTHER_SECTOR_SIZES = (512, 4096)
MAX_SECTOR_SIZE = 65536
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
    @ivar sectorSize: the logical sector size the table was read with.
    @ivar firstLBA: its first LBA.
    @ivar lastLBA: its last LBA (inclusive).
    """

    name: str
    index: int
    offset: int
    length: int
    sectorSize: int
    firstLBA: int
    lastLBA: int


@dataclass(frozen=True)
class Table:
    """
    A GPT whose primary and backup headers agree.

    @ivar size: the disk's size in bytes.
    @ivar firstUsable: the first LBA a partition may use.
    @ivar lastUsable: the last LBA a partition may use.
    @ivar backupLBA: where the backup header is (the disk's last LBA, or
        the last of the image written to it).
    @ivar partitions: the used entries, in the order of the array.
    """

    sectorSize: int
    size: int
    firstUsable: int
    lastUsable: int
    backupLBA: int
    partitions: tuple[Partition, ...]


@dataclass(frozen=True)
class _Header:
    lba: int
    alternateLBA: int
    firstUsable: int
    lastUsable: int
    diskGUID: bytes
    entrySize: int
    entries: bytes


def logicalBlockSize(fd: int, imageSectorSize: int = IMAGE_SECTOR_SIZE) -> int:
    """
    The logical block size of the disk open as C{fd}: the kernel's for a
    block device, C{imageSectorSize} for a disk image file.

    @raise GPTError: neither, or the kernel's size cannot be read.
    """
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        size = imageSectorSize
    elif stat.S_ISBLK(mode):
        try:
            (size,) = struct.unpack("i", fcntl.ioctl(fd, BLKSSZGET, bytes(4)))
        except OSError as e:
            raise GPTError(
                f"cannot read the logical block size: {e.strerror}"
            ) from None
    else:
        raise GPTError("neither a block device nor a disk image file")
    if not 512 <= size <= MAX_SECTOR_SIZE or size & (size - 1):
        raise GPTError(f"logical block size {size} is not one a GPT is read with")
    return int(size)


def _header(fd: int, lba: int, sectorSize: int) -> _Header | str:
    """
    The valid header at C{lba} with its entry array, or why there is none.
    """
    raw = os.pread(fd, sectorSize, lba * sectorSize)
    if len(raw) < _HEADER.size or raw[:8] != SIGNATURE:
        return "no GPT signature"
    (
        _sig, _rev, headerSize, headerCRC, _res, myLBA, alternateLBA, first, last,
        guid, entriesLBA, count, entrySize, entriesCRC,
    ) = _HEADER.unpack_from(raw)  # fmt: skip
    if not _HEADER.size <= headerSize <= sectorSize:
        return f"header size {headerSize}"
    check = bytearray(raw[:headerSize])
    check[16:20] = bytes(4)
    if zlib.crc32(check) != headerCRC:
        return "header CRC mismatch"
    if myLBA != lba:
        return f"it says it is at LBA {myLBA}"
    if not 0 < count <= MAX_ENTRIES or not 128 <= entrySize <= MAX_ENTRY_SIZE:
        return f"{count} entries of {entrySize} bytes"
    if entrySize % 8:
        return f"{count} entries of {entrySize} bytes"
    if not 1 < first <= last:
        return f"usable LBAs {first}-{last}"
    arrayLast = entriesLBA + (count * entrySize - 1) // sectorSize
    if entriesLBA < 2 or entriesLBA <= lba <= arrayLast:
        return f"entry array at LBA {entriesLBA}"
    if entriesLBA <= last and first <= arrayLast:
        return f"entry array at LBAs {entriesLBA}-{arrayLast}, inside the usable LBAs"
    entries = os.pread(fd, count * entrySize, entriesLBA * sectorSize)
    if len(entries) != count * entrySize:
        return "entry array past the disk's end"
    if zlib.crc32(entries) != entriesCRC:
        return "entry array CRC mismatch"
    return _Header(lba, alternateLBA, first, last, guid, entrySize, entries)


def _differences(primary: _Header, backup: _Header) -> list[str]:
    differ = []
    if primary.diskGUID != backup.diskGUID:
        differ.append("the disk GUID")
    if (primary.firstUsable, primary.lastUsable) != (
        backup.firstUsable,
        backup.lastUsable,
    ):
        differ.append("the usable LBAs")
    if (primary.entrySize, primary.entries) != (backup.entrySize, backup.entries):
        differ.append("the partition entries")
    if backup.alternateLBA != primary.lba:
        differ.append(f"where the primary is (LBA {backup.alternateLBA})")
    return differ


def _noPrimary(fd: int, why: str, sectorSize: int, lastLBA: int) -> str:
    """The line for a disk without a valid primary header: why, and what
    is there instead (a header for other sectors, a valid backup)."""
    line = f"no valid GPT header at LBA 1 with {sectorSize}-byte sectors ({why})"
    size = (lastLBA + 1) * sectorSize
    for other in OTHER_SECTOR_SIZES:
        if other != sectorSize and size >= 3 * other:
            if not isinstance(_header(fd, 1, other), str):
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    return (
                        f"{line}; there is one for {other}-byte sectors, and an"
                        f" image file is read with {sectorSize}-byte sectors"
                    )
                return (
                    f"{line}; there is one for {other}-byte sectors, which this"
                    " disk does not use"
                )
    if not isinstance(_header(fd, lastLBA, sectorSize), str):
        return (
            f"{line}; the backup at LBA {lastLBA} is valid: repair the table or"
            " write the image again"
        )
    return line


def _partitions(header: _Header, sectorSize: int) -> tuple[Partition, ...]:
    found = []
    for index in range(len(header.entries) // header.entrySize):
        typeGUID, _uniq, first, last, _attrs, rawName = _ENTRY.unpack_from(
            header.entries, index * header.entrySize
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
                firstLBA=first,
                lastLBA=last,
            )
        )
    return tuple(found)


def readTable(fd: int, imageSectorSize: int = IMAGE_SECTOR_SIZE) -> Table:
    """
    The GPT on the disk open as C{fd}, read with the disk's logical block
    size (L{logicalBlockSize}).

    @raise GPTError: no valid primary header; its backup outside the disk,
        not valid, or disagreeing with it.
    """
    sectorSize = logicalBlockSize(fd, imageSectorSize)
    size = os.lseek(fd, 0, os.SEEK_END)
    lastLBA = size // sectorSize - 1
    if lastLBA < 2:
        raise GPTError(f"too small for a GPT with {sectorSize}-byte sectors")
    primary = _header(fd, 1, sectorSize)
    if isinstance(primary, str):
        raise GPTError(_noPrimary(fd, primary, sectorSize, lastLBA))
    backupLBA = primary.alternateLBA
    if backupLBA > lastLBA:
        raise GPTError(
            f"the GPT's primary header puts its backup at LBA {backupLBA},"
            f" past the disk's last LBA {lastLBA}"
        )
    if backupLBA <= primary.lastUsable:
        raise GPTError(
            f"the GPT's primary header puts its backup at LBA {backupLBA},"
            f" inside its usable LBAs {primary.firstUsable}-{primary.lastUsable}"
        )
    backup = _header(fd, backupLBA, sectorSize)
    if isinstance(backup, str):
        raise GPTError(
            f"the GPT's backup header at LBA {backupLBA} is not valid ({backup});"
            " the primary is not used alone"
        )
    differ = _differences(primary, backup)
    if differ:
        raise GPTError(
            f"the GPT's primary header (LBA 1) and its backup (LBA {backupLBA})"
            f" disagree on {', '.join(differ)}"
        )
    return Table(
        sectorSize=sectorSize,
        size=size,
        firstUsable=primary.firstUsable,
        lastUsable=primary.lastUsable,
        backupLBA=backupLBA,
        partitions=_partitions(primary, sectorSize),
    )


def findByName(
    fd: int, name: str, imageSectorSize: int = IMAGE_SECTOR_SIZE
) -> Partition:
    """
    The one partition named C{name}, inside the disk's usable LBAs and
    overlapping no other partition: where writing it touches nothing else.

    @param imageSectorSize: the sector size a disk image file is read
        with (a block device's is the kernel's).
    @raise GPTError: no table (L{readTable}); no such partition, several,
        or one past the disk's end, outside the usable LBAs or overlapping
        another.
    """
    table = readTable(fd, imageSectorSize)
    named = [p for p in table.partitions if p.name == name]
    if not named:
        raise GPTError(f"no partition named {name}")
    if len(named) > 1:
        numbers = ", ".join(str(p.index) for p in named)
        raise GPTError(f"partitions {numbers} are all named {name}")
    (found,) = named
    if found.offset + found.length > table.size:
        raise GPTError(f"partition {found.index} ({name}) lies past the disk's end")
    if found.firstLBA < table.firstUsable or found.lastLBA > table.lastUsable:
        raise GPTError(
            f"partition {found.index} ({name}) lies outside the GPT's usable LBAs"
            f" {table.firstUsable}-{table.lastUsable}"
        )
    for other in table.partitions:
        if other.index != found.index and (
            other.firstLBA <= found.lastLBA and found.firstLBA <= other.lastLBA
        ):
            raise GPTError(
                f"partition {found.index} ({name}) overlaps partition"
                f" {other.index} ({other.name})"
            )
    return found
