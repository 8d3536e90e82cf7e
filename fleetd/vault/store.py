"""
The volatile vault: rendered Talos configurations, one file each [V1] [V2].

Configurations are secrets, so they live only in memory and in a directory
on tmpfs/ramfs (C{/run/fleetd/configs}): a fleetd restart loses nothing, a
reboot empties it.  L{DirectoryVault} writes every entry atomically (temp
file, fsync, rename, fsync of the directory) with mode 0600 in a 0700
directory and rebuilds its memory from the directory when opened.

Names, never contents, appear in errors and logs.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from twisted.logger import Logger

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")

TEMP_PREFIX = ".tmp-"
"""Prefix of in-flight writes; such a file found on open is a torn write."""

VOLATILE_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MOUNTINFO = Path("/proc/self/mountinfo")

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


class VaultError(Exception):
    """A vault name, directory or write is unacceptable; one-line message."""


@runtime_checkable
class IVault(Protocol):
    """A mapping of validated names to secret bytes."""

    def put(self, name: str, data: bytes) -> None:
        """Store C{data} under C{name}, replacing any previous value."""

    def get(self, name: str) -> bytes | None:
        """Return the value stored under C{name}, or L{None}."""

    def delete(self, name: str) -> None:
        """Forget C{name}; no error if it is absent."""

    def names(self) -> list[str]:
        """Return all stored names, sorted."""

    def __len__(self) -> int:
        """Return the number of stored entries."""

    def __contains__(self, name: object) -> bool:
        """Return whether C{name} is stored."""


def checkName(name: str) -> str:
    """Return C{name} if it is a valid vault name, else raise L{VaultError}."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        shown = repr(name[:64]) if isinstance(name, str) else type(name).__name__
        raise VaultError(f"bad vault name {shown}")
    return name


def _isValidName(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


class MemoryVault:
    """A dict-backed L{IVault}, for tests and as L{DirectoryVault}'s cache."""

    def __init__(self, entries: Iterable[tuple[str, bytes]] = ()) -> None:
        self._entries: dict[str, bytes] = {}
        for name, data in entries:
            self.put(name, data)

    def put(self, name: str, data: bytes) -> None:
        self._entries[checkName(name)] = bytes(data)

    def get(self, name: str) -> bytes | None:
        return self._entries.get(checkName(name))

    def delete(self, name: str) -> None:
        self._entries.pop(checkName(name), None)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return _isValidName(name) and name in self._entries


def parseMountInfo(text: str) -> list[tuple[str, str]]:
    """
    Parse C{/proc/self/mountinfo} into C{(mountPoint, fsType)} pairs, in
    file order, undoing the kernel's octal escapes (C{\\040} for a space).
    """
    mounts: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            mountPoint, fsType = fields[4], fields[separator + 1]
        except (ValueError, IndexError):
            continue
        mountPoint = _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m[1], 8)), mountPoint)
        mounts.append((mountPoint, fsType))
    return mounts


def _mountFor(path: str, mounts: Iterable[tuple[str, str]]) -> str | None:
    """Return the fs type of the longest mount point containing C{path}."""
    best: tuple[int, str] | None = None
    for mountPoint, fsType in mounts:
        prefix = mountPoint.rstrip("/") + "/"
        if path == mountPoint or path.startswith(prefix):
            # ">=": a later mount on the same point hides the earlier one.
            if best is None or len(mountPoint) >= best[0]:
                best = (len(mountPoint), fsType)
    return None if best is None else best[1]


def filesystemType(path: Path, mountinfo: Path = MOUNTINFO) -> str:
    """Return the type of the filesystem holding C{path}, per C{mountinfo}."""
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise VaultError(f"cannot read {mountinfo}: {e.strerror}") from e
    fsType = _mountFor(os.fspath(path.resolve()), parseMountInfo(text))
    if fsType is None:
        raise VaultError(f"no mount in {mountinfo} holds {path}")
    return fsType


def _makeDirectory(path: Path) -> None:
    """Create C{path} and any missing parents with mode 0700."""
    missing = []
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIRECTORY_MODE)
        except FileExistsError:
            pass


class DirectoryVault:
    """An L{IVault} whose memory is mirrored to one directory [V1] [V2]."""

    log = Logger()

    def __init__(
        self,
        path: Path,
        entries: dict[str, bytes],
        fsync: Callable[[int], None] = os.fsync,
    ) -> None:
        """Use L{DirectoryVault.open}; this trusts C{path} and C{entries}."""
        self.path = path
        self._entries = entries
        self._fsync = fsync

    @classmethod
    def open(
        cls,
        path: Path,
        allowAnyFilesystem: bool = False,
        *,
        mountinfo: Path = MOUNTINFO,
        fsync: Callable[[int], None] = os.fsync,
    ) -> DirectoryVault:
        """
        Prepare the vault directory and rebuild the vault from it [V2].

        @param allowAnyFilesystem: accept a directory that is not on
            tmpfs/ramfs (dev, tests) [V1].
        @param mountinfo: where to read mounts from; injectable for tests.
        @param fsync: how to flush a file descriptor; injectable for tests.
        @raise VaultError: the directory cannot be used.
        """
        try:
            _makeDirectory(path)
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode):
                raise VaultError(f"vault path {path} is not a directory")
            if stat.S_IMODE(st.st_mode) != DIRECTORY_MODE:
                os.chmod(path, DIRECTORY_MODE)
        except OSError as e:
            raise VaultError(f"cannot prepare vault {path}: {e.strerror}") from e
        try:
            fsType = filesystemType(path, mountinfo)
        except VaultError:
            if not allowAnyFilesystem:
                raise
            fsType = "unknown"
        if fsType not in VOLATILE_FILESYSTEMS:
            if not allowAnyFilesystem:
                raise VaultError(
                    f"vault directory {path} is on {fsType}, not tmpfs or ramfs"
                )
            cls.log.warn(
                "vault.persistent_filesystem {path} {fsType}",
                path=str(path),
                fsType=fsType,
            )
        vault = cls(path, {}, fsync)
        vault._load()
        return vault

    def _openDirectory(self) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _load(self) -> None:
        """Fill memory from the directory, removing torn writes."""
        dirFd = self._openDirectory()
        try:
            removed = False
            for entry in os.scandir(dirFd):
                name = entry.name
                isFile = entry.is_file(follow_symlinks=False)
                if name.startswith(TEMP_PREFIX) and isFile:
                    os.unlink(name, dir_fd=dirFd)
                    removed = True
                    self.log.info("vault.torn_write {name}", name=name)
                elif _isValidName(name) and isFile:
                    self._entries[name] = self._readEntry(dirFd, name)
                else:
                    self.log.warn("vault.ignored {name}", name=name)
            if removed:
                self._fsync(dirFd)
        except OSError as e:
            raise VaultError(f"cannot load vault {self.path}: {e.strerror}") from e
        finally:
            os.close(dirFd)
        self.log.info("vault.loaded {entries}", entries=len(self._entries))

    def _readEntry(self, dirFd: int, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirFd)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
                self.log.warn("vault.fixed_mode {name}", name=name)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def put(self, name: str, data: bytes) -> None:
        """Write C{data} atomically, then remember it [V1]."""
        checkName(name)
        data = bytes(data)
        temp = TEMP_PREFIX + secrets.token_hex(8)
        try:
            dirFd = self._openDirectory()
            try:
                self._writeTemp(dirFd, temp, data)
                try:
                    os.rename(temp, name, src_dir_fd=dirFd, dst_dir_fd=dirFd)
                except BaseException:
                    _unlinkQuietly(temp, dirFd)
                    raise
                # The new file is now what a restart sees; memory follows.
                self._entries[name] = data
                self._fsync(dirFd)
            finally:
                os.close(dirFd)
        except OSError as e:
            raise VaultError(f"cannot write vault entry {name}: {e.strerror}") from e

    def _writeTemp(self, dirFd: int, temp: str, data: bytes) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, FILE_MODE, dir_fd=dirFd)
        try:
            os.fchmod(fd, FILE_MODE)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            self._fsync(fd)
        except BaseException:
            os.close(fd)
            _unlinkQuietly(temp, dirFd)
            raise
        os.close(fd)

    def get(self, name: str) -> bytes | None:
        return self._entries.get(checkName(name))

    def delete(self, name: str) -> None:
        """Unlink the file durably, then forget C{name}."""
        checkName(name)
        try:
            dirFd = self._openDirectory()
            try:
                try:
                    os.unlink(name, dir_fd=dirFd)
                except FileNotFoundError:
                    self._entries.pop(name, None)
                    return
                # The file is gone from what a restart sees; memory follows.
                self._entries.pop(name, None)
                self._fsync(dirFd)
            finally:
                os.close(dirFd)
        except OSError as e:
            raise VaultError(f"cannot delete vault entry {name}: {e.strerror}") from e

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return _isValidName(name) and name in self._entries


def _unlinkQuietly(name: str, dirFd: int) -> None:
    try:
        os.unlink(name, dir_fd=dirFd)
    except OSError as e:
        if e.errno != errno.ENOENT:
            DirectoryVault.log.warn("vault.temp_left {name}", name=name)
