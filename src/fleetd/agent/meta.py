"""
C{fleetd-agent meta write|read --disk DEV}: Talos's META partition on a
disk (or disk image file) that is not booted, as C{talosctl meta write}
edits it on a running node.

META is the GPT partition named C{META} (Talos's C{MetaPartitionLabel},
C{pkg/machinery/constants/constants.go}); its first 512 KiB hold two
copies of the key/value format in L{fleetd.agent.adv}. A write keeps
every other key, writes both copies (repairing a bad one from the good
one), syncs, drops the cached pages and reads the area back, which must
be byte for byte what was written. A full META is refused before
anything is written. When neither copy is good and the area is not blank
(a partition Talos never wrote), nothing is written: Talos would start
afresh and drop whatever was there, which only an operator should decide
(by zeroing the partition).

C{plan --write-meta DEV} writes the run's code as key C{0x0b}
(C{DownloadURLCode}, Talos's C{${code}}) through L{writeKeys}, after
L{checkTarget} confirmed DEV is the plan's target disk.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fleetd.agent import adv, gpt
from fleetd.agent.sysfs import blockDevice
from fleetd.clitools import CLIError, addJSONOption, writeJSON

# pkg/machinery/constants/constants.go: MetaPartitionLabel = "META".
LABEL = "META"
# pkg/machinery/meta/constants.go: DownloadURLCode (iota + 6 = 0x0b).
DOWNLOAD_URL_CODE = 0x0B


class MetaError(Exception):
    """One line: why META on a disk cannot be read or written."""


@dataclass(frozen=True)
class Result:
    """
    What a read or a write found (and left): the tags, and one line per
    copy that was not good (or the copies' disagreement).
    """

    disk: str
    tags: dict[int, bytes]
    notes: tuple[str, ...]


def _open(disk: str, write: bool) -> int:
    """
    A descriptor on C{disk}, a block device (opened exclusively for a
    write: the kernel refuses while a partition is mounted) or a regular
    file, locked as udev and Talos expect (C{flock} on the whole disk).
    """
    try:
        mode = os.stat(disk).st_mode
    except FileNotFoundError:
        raise MetaError(f"{disk}: no such disk or image file") from None
    except OSError as e:
        raise MetaError(f"{disk}: {e.strerror}") from None
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC
    if stat.S_ISBLK(mode):
        flags |= os.O_EXCL if write else 0
    elif not stat.S_ISREG(mode):
        raise MetaError(f"{disk}: neither a block device nor a disk image file")
    try:
        fd = os.open(disk, flags)
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise MetaError(f"{disk}: in use (mounted or held open)") from None
        raise MetaError(f"{disk}: {e.strerror}") from None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if write else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise MetaError(f"{disk}: locked by another program") from None
    return fd


def _area(fd: int, disk: str) -> tuple[gpt.Partition, bytes]:
    try:
        part = gpt.findByName(fd, LABEL)
    except gpt.GPTError as e:
        raise MetaError(f"{disk}: {e}") from None
    if part.length < adv.SIZE:
        raise MetaError(
            f"{disk}: partition {part.index} ({LABEL}) holds {part.length} bytes,"
            f" fewer than META's {adv.SIZE}"
        )
    return part, os.pread(fd, adv.SIZE, part.offset)


def _notes(disk: str, loaded: adv.Loaded, verb: str) -> tuple[str, ...]:
    notes = []
    good = 1 if loaded.states[0] is adv.CopyState.GOOD else 2
    for index, problem in enumerate(loaded.problems, 1):
        if problem is not None and loaded.tags is not None:
            notes.append(
                f"copy {index} of META on {disk} is bad ({problem}); {verb} copy {good}"
            )
    if loaded.differ:
        notes.append(f"the copies of META on {disk} differ; {verb} copy 1, as Talos")
    return tuple(notes)


def _noGoodCopy(disk: str, loaded: adv.Loaded) -> MetaError:
    first, second = loaded.problems
    return MetaError(
        f"no good copy of META on {disk} (copy 1: {first}; copy 2: {second})"
    )


def readKeys(disk: str) -> Result:
    """
    The keys of META on C{disk}, from the copy Talos would use; a
    partition never written holds none.

    @raise MetaError: no disk, no META, or neither copy good.
    """
    fd = _open(disk, write=False)
    try:
        _part, area = _area(fd, disk)
    finally:
        os.close(fd)
    loaded = adv.load(area)
    if loaded.tags is None and not loaded.fresh:
        raise _noGoodCopy(disk, loaded)
    return Result(disk, loaded.tags or {}, _notes(disk, loaded, "read from"))


def _pwriteAll(fd: int, data: bytes, offset: int) -> None:
    done = 0
    while done < len(data):
        written = os.pwrite(fd, data[done:], offset + done)
        if written <= 0:
            raise OSError(errno.EIO, "short write")
        done += written


def writeKeys(disk: str, updates: dict[int, bytes]) -> Result:
    """
    Set C{updates} in META on C{disk}, keeping every other key: both
    copies written, synced and read back.

    @raise MetaError: no disk or META, META full (nothing written), no good
        copy in a written META (nothing written), or the write or the read
        back failed.
    """
    fd = _open(disk, write=True)
    try:
        part, area = _area(fd, disk)
        loaded = adv.load(area)
        if loaded.tags is None and not loaded.fresh:
            raise _noGoodCopy(disk, loaded)
        tags = {**(loaded.tags or {}), **updates}
        try:
            blob = adv.serialize(tags)
        except adv.ADVError as e:
            raise MetaError(f"{disk}: {e}; nothing written") from None
        try:
            _pwriteAll(fd, blob, part.offset)
            os.fsync(fd)
            # Read what the disk holds, not what the page cache kept.
            os.posix_fadvise(fd, part.offset, adv.SIZE, os.POSIX_FADV_DONTNEED)
            back = os.pread(fd, adv.SIZE, part.offset)
        except OSError as e:
            raise MetaError(f"{disk}: writing META failed: {e.strerror}") from None
    finally:
        os.close(fd)
    if back != blob or adv.load(back).tags != tags:
        raise MetaError(f"{disk}: META read back differs from what was written")
    return Result(disk, tags, _notes(disk, loaded, "rewritten from"))


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


def keysJSON(tags: dict[int, bytes]) -> dict[str, str]:
    """C{{"0x0b": "..."}}: values as UTF-8 text (other bytes escaped)."""
    return {adv.keyName(tag): _text(tags[tag]) for tag in sorted(tags)}


def checkTarget(
    disk: str,
    target: str | None,
    imageFile: bool,
    sysfsRoot: Path,
) -> str | None:
    """
    Refuse C{disk} unless it is the plan's target disk (its serial, read
    from sysfs as C{fleetd-agent disks} reads it,, equal to C{target} but
    for case), or, with C{imageFile}, a disk image file: then the serial
    cannot be checked and the returned warning says so.

    @raise MetaError: C{not-target-disk: ...}, naming why.
    """
    try:
        st = os.stat(disk)
    except OSError as e:
        raise MetaError(f"not-target-disk: {disk}: {e.strerror}") from None
    if stat.S_ISREG(st.st_mode):
        if not imageFile:
            raise MetaError(
                f"not-target-disk: {disk} is a file, not the plan's target disk"
                f" {target or '-'} (--image-file writes a disk image file)"
            )
        return (
            f"fleetd-agent: warning: {disk} is an image file; it was not checked"
            f" against the plan's target disk serial {target or '-'}"
        )
    if imageFile:
        raise MetaError(f"not-target-disk: --image-file, but {disk} is not a file")
    if not stat.S_ISBLK(st.st_mode):
        raise MetaError(f"not-target-disk: {disk} is not a block device")
    found = blockDevice(st.st_rdev, sysfsRoot)
    if found.partition:
        raise MetaError(
            f"not-target-disk: {disk} ({found.name}) is a partition; give the disk"
        )
    if not target:
        raise MetaError("not-target-disk: the plan names no target disk")
    if found.serial is None:
        raise MetaError(
            f"not-target-disk: {disk} ({found.name}) reports no serial;"
            f" the plan's target disk is {target}"
        )
    if found.serial.casefold() != target.casefold():
        raise MetaError(
            f"not-target-disk: {disk} ({found.name}) is disk {found.serial},"
            f" not the plan's target disk {target}"
        )
    return None


def writePlanCode(
    args: argparse.Namespace, plan: dict[str, Any], warn: Callable[[str], None]
) -> Result:
    """
    C{plan --write-meta DEV}: the plan's code as key C{0x0b} on DEV, which
    must be the plan's target disk (L{checkTarget}).

    @raise MetaError: C{meta-code-missing} (no ready run),
        C{not-target-disk}, or what L{writeKeys} raises.
    """
    code = plan.get("meta_0x0b")
    if not code:
        raise MetaError("meta-code-missing: the plan carries no META 0x0b code")
    warning = checkTarget(
        args.write_meta,
        plan.get("target_disk_serial"),
        args.image_file,
        Path(args.sysfs_root),
    )
    if warning is not None:
        warn(warning)
    return writeKeys(args.write_meta, {DOWNLOAD_URL_CODE: str(code).encode("utf-8")})


def addArguments(parser: argparse.ArgumentParser) -> None:
    """C{meta write --disk DEV KEY VALUE} and C{meta read --disk DEV}."""
    sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    write = sub.add_parser("write", help="set one META key on a disk")
    write.add_argument("--disk", required=True, metavar="DEV", help="disk or image")
    write.add_argument("key", help="META key, e.g. 0x0b")
    write.add_argument("value", help="its value")
    read = sub.add_parser("read", help="print META's keys")
    read.add_argument("--disk", required=True, metavar="DEV", help="disk or image")
    for command in (write, read):
        addJSONOption(command, after=True)


def _line(key: str, value: str) -> str:
    shown = value if value.isprintable() else repr(value)
    return f"{key} {shown}\n"


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """The C{meta} command: 0, or a L{CLIError} line."""
    try:
        if args.action == "write":
            tag = adv.parseKey(args.key)
            result = writeKeys(args.disk, {tag: args.value.encode("utf-8")})
        else:
            result = readKeys(args.disk)
    except (MetaError, adv.ADVError) as e:
        raise CLIError(f"fleetd-agent: meta {args.action}: {e}") from None
    for note in result.notes:
        err.write(f"fleetd-agent: meta {args.action}: {note}\n")
    keys = keysJSON(result.tags)
    if args.action == "write":
        name = adv.keyName(tag)
        if args.json:
            writeJSON(out, {"disk": args.disk, "written": name, "keys": keys})
        else:
            out.write(f"META {name} written on {args.disk} (both copies, read back)\n")
    elif args.json:
        writeJSON(out, {"keys": keys})
    else:
        out.write("".join(_line(key, value) for key, value in keys.items()))
    return 0
