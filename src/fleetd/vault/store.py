"""
The volatile vault: rendered Talos configurations, one file each [V1] [V2].

Configurations are secrets, so they live only in memory and in a directory
on tmpfs/ramfs (C{/run/fleetd/configs}): a fleetd restart loses nothing, a
reboot empties it.  L{DirectoryVault} opens that directory once, without
following links and only when fleetd or root controls every directory on
the way (L{fleetd.vault.safedir}); it keeps the descriptor and does every
file operation relative to it. Every entry is written atomically (temp
file, fsync, rename, fsync of the directory) with mode 0600 in a 0700
directory. Opening it lists the directory and keeps the names of the
regular files fleetd owns (their contents stay in the tmpfs pages, which
are memory already); L{DirectoryVault.get} reads one file, through the
same checks, when it is asked for. A second copy of every configuration
in fleetd's heap cost 50 MB and most of a second of start-up at 50,000
runs (docs/benchmarks.md, "Ready in 2 s").

Names, never contents, appear in errors and logs.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

from twisted.logger import Logger

from fleetd.vault.errors import VaultError, VaultWriteError
from fleetd.vault.files import entryKind, processUmask
from fleetd.vault.interface import checkName, isValidName
from fleetd.vault.mounts import MOUNTINFO, isVolatile
from fleetd.vault.safedir import openVaultDirectory

TEMP_PREFIX = ".tmp-"
"""Prefix of in-flight writes; such a file found on open is a torn write."""

# Temporary names: this process's id and a counter, unique among the
# processes alive (a dead one's leftovers are removed when a vault opens)
# without asking the kernel for random bytes on every write; O_EXCL still
# refuses to write over anything already there. The id is asked once per
# process (a system call each time otherwise), again after a fork.
_temps = itertools.count()
_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))

FILE_MODE = 0o600

_OURS = stat.S_IFREG | FILE_MODE  # the st_mode of an entry of ours
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _noSync(fd: int) -> None:
    """fsync for a filesystem that has nothing to flush to."""


class DirectoryVault:
    """An L{IClosableVault} whose memory is mirrored to one directory [V1] [V2]."""

    log = Logger()

    def __init__(
        self,
        path: Path,
        dirFd: int,
        uid: int,
        *,
        fsync: Callable[[int], None] = os.fsync,
        write: Callable[[int, memoryview], int] = os.write,
    ) -> None:
        """
        Use L{DirectoryVault.open}; this trusts C{dirFd}, and owns it from
        now on (closed by L{close}, or when the vault is collected).
        """
        self.path = path
        self._fd = dirFd
        self._uid = uid
        self._names: set[str] = set()
        self._unchecked: list[str] = []  # listed, not yet inspected
        self._fsync = fsync
        self._syncs = True  # False where fsync is a no-op (tmpfs): not called
        self._write = write
        self._open = True
        self._closer = weakref.finalize(self, os.close, dirFd)
        # Created files get FILE_MODE less the umask: only an umask that
        # takes bits of FILE_MODE away calls for a chmod after each create.
        umask = processUmask()
        self._narrowingUmask = umask is None or bool(umask & FILE_MODE)

    @classmethod
    def open(
        cls,
        path: Path,
        allowAnyFilesystem: bool = False,
        *,
        check: bool = True,
        mountinfo: Path = MOUNTINFO,
        fsync: Callable[[int], None] = os.fsync,
        write: Callable[[int, memoryview], int] = os.write,
    ) -> DirectoryVault:
        """
        Open the vault directory safely and rebuild the vault from it [V1] [V2].

        @param allowAnyFilesystem: accept a directory that is not on
            tmpfs/ramfs (dev, tests) [V1]. Ownership and links are checked
            all the same.
        @param check: look at every entry now (L{inspect}, then
            L{settle}). With L{False} the names are listed (links and
            other entries that are not files are refused at once) and the
            caller must call both before it trusts a name: the daemon
            runs L{inspect} in a thread while its database reads run
            (100,000 C{lstat}s at 50,000 runs, docs/benchmarks.md).
        @param mountinfo: where to read mounts from; injectable for tests.
        @param fsync: how to flush a file descriptor; injectable for tests.
        @param write: how to write to a file descriptor (C{os.write}'s
            signature); injectable for tests, e.g. to fail with C{ENOSPC}.
        @raise VaultError: the directory cannot be used.
        """
        uid = os.geteuid()
        opened = openVaultDirectory(path, uid)
        vault = cls(Path(opened.path), opened.fd, uid, fsync=fsync, write=write)
        try:
            vault._checkFilesystem(allowAnyFilesystem, mountinfo)
            vault._list()
            if check:
                vault.settle(vault.inspect())
        except BaseException:
            vault.close()
            raise
        return vault

    def _checkFilesystem(self, allowAnyFilesystem: bool, mountinfo: Path) -> None:
        volatile = isVolatile(self.path, allowAnyFilesystem, mountinfo)
        if volatile and self._fsync is os.fsync:
            # tmpfs and ramfs have no backing store: fsync makes nothing
            # more durable (a fleetd crash keeps their pages, a reboot
            # loses them either way), so skip its syscalls.
            self._fsync = _noSync
            self._syncs = False

    @property
    def closed(self) -> bool:
        return not self._open

    def close(self) -> None:
        """Close the directory descriptor; later writes raise L{VaultError}."""
        self._open = False
        self._closer()

    def _dirFd(self) -> int:
        if not self._open:
            raise VaultError(f"vault {self.path} is closed")
        return self._fd

    def _list(self) -> None:
        """
        Learn the names from the directory, before anything is trusted:
        names of ours are kept (torn writes aside) until L{settle} says
        otherwise; entries that are not regular files are refused now.
        """
        dirFd = self._dirFd()
        unchecked, ignored, others = [], [], []
        changed = False
        try:
            # Directory order: sorting 100,000 entries cost 30 ms of the
            # start; the rare ones logged below are sorted instead.
            with os.scandir(dirFd) as entries:
                for entry in entries:
                    name = entry.name
                    temp = name.startswith(TEMP_PREFIX)
                    if not (temp or isValidName(name)):
                        ignored.append(name)
                    elif not entry.is_file(follow_symlinks=False):
                        others.append(name)
                    else:
                        unchecked.append(name)
                        if not temp:
                            self._names.add(name)
            for name in sorted(ignored):
                self.log.warn("vault.ignored {name}", name=name)
            for name in sorted(others):
                changed = self._refuse(dirFd, name) or changed
            if changed:
                self._fsync(dirFd)
        except OSError as e:
            raise VaultError(f"cannot load vault {self.path}: {e.strerror}") from e
        self._unchecked = unchecked

    def inspect(self) -> list[str]:
        """
        The listed files L{settle} must look at again: torn writes, and
        files not ours or not of mode 0600. One C{lstat} per file and no
        change to the directory or to this vault's state, so it may run in
        another thread while the reactor goes on (until L{settle}).
        """
        dirFd, uid = self._dirFd(), self._uid
        found = []
        try:
            for name in self._unchecked:
                st = os.stat(name, dir_fd=dirFd, follow_symlinks=False)
                if (
                    st.st_uid != uid
                    or st.st_mode != _OURS
                    or name.startswith(TEMP_PREFIX)
                ):
                    found.append(name)
        except FileNotFoundError:
            return list(self._unchecked)  # settle looks at each again
        except OSError as e:
            raise VaultError(f"cannot load vault {self.path}: {e.strerror}") from e
        return found

    def settle(self, found: list[str]) -> None:
        """
        In the reactor's thread, after L{inspect}: remove torn writes,
        refuse (and remove) what is not a regular file of ours, put a wrong
        mode right. Every name left is then trusted.
        """
        dirFd = self._dirFd()
        changed = False
        try:
            for name in found:
                try:
                    ours = self._isOurs(dirFd, name)
                except FileNotFoundError:
                    self._names.discard(name)
                    continue
                if not ours:
                    self._names.discard(name)
                    changed = self._refuse(dirFd, name) or changed
                elif name.startswith(TEMP_PREFIX):
                    os.unlink(name, dir_fd=dirFd)
                    changed = True
                    self.log.info("vault.torn_write {name}", name=name)
            if changed:
                self._fsync(dirFd)
        except OSError as e:
            raise VaultError(f"cannot load vault {self.path}: {e.strerror}") from e
        self._unchecked = []
        self.log.info("vault.loaded {entries}", entries=len(self._names))

    def _isOurs(self, dirFd: int, name: str) -> bool:
        """
        Whether C{name} is a regular file of ours (a link is not followed);
        a wrong mode is put right, through a descriptor.
        """
        st = os.stat(name, dir_fd=dirFd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != self._uid:
            return False
        if stat.S_IMODE(st.st_mode) != FILE_MODE:
            return self._readEntry(dirFd, name, fixMode=True) is not None
        return True

    def _readEntry(self, dirFd: int, name: str, fixMode: bool = False) -> bytes | None:
        """The contents of C{name}, or L{None} when it is not ours to read."""
        try:
            fd = os.open(name, _READ, dir_fd=dirFd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None  # a symbolic link
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self._uid:
                return None
            if fixMode and stat.S_IMODE(st.st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
                self.log.warn("vault.fixed_mode {name}", name=name)
            # One read when the file is the size fstat said (files of ours
            # are renamed into place whole); more only if it grew since.
            data = os.read(fd, st.st_size + 1)
            if len(data) <= st.st_size:
                return data
            chunks = [data]
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _refuse(self, dirFd: int, name: str) -> bool:
        """Log and remove an entry that is not a regular file of ours."""
        st = os.stat(name, dir_fd=dirFd, follow_symlinks=False)
        kind = entryKind(st.st_mode)
        removable = not stat.S_ISDIR(st.st_mode)
        self.log.warn(
            "vault.refused {name} {kind} {owner} {removed}",
            name=name,
            kind=kind,
            owner=st.st_uid,
            removed=removable,
        )
        if removable:
            os.unlink(name, dir_fd=dirFd)
        return removable

    def put(self, name: str, data: bytes) -> None:
        """Write C{data} atomically, then remember it [V1]."""
        checkName(name)
        data = bytes(data)
        dirFd = self._dirFd()
        temp = f"{TEMP_PREFIX}{_pid[0]:x}-{next(_temps):x}"
        try:
            self._writeTemp(dirFd, temp, data)
            try:
                os.rename(temp, name, src_dir_fd=dirFd, dst_dir_fd=dirFd)
            except BaseException:
                _unlinkQuietly(temp, dirFd)
                raise
            # The new file is now what a restart (and get) sees.
            self._names.add(name)
            if self._syncs:
                self._fsync(dirFd)
        except OSError as e:
            raise VaultWriteError("write", name, e) from e

    def _writeTemp(self, dirFd: int, temp: str, data: bytes) -> None:
        fd = os.open(temp, _CREATE, FILE_MODE, dir_fd=dirFd)
        try:
            if self._narrowingUmask:
                os.fchmod(fd, FILE_MODE)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[self._write(fd, view) :]
            if self._syncs:
                self._fsync(fd)
        except BaseException:
            os.close(fd)
            _unlinkQuietly(temp, dirFd)
            raise
        os.close(fd)

    def get(self, name: str) -> bytes | None:
        """
        Read C{name}'s file (on tmpfs, a copy from memory) with the checks
        of L{open}. A file that vanished, or is no longer a regular file of
        ours, is L{None} and logged: only fleetd and root can touch the
        directory.
        """
        # Only valid names are held: the name check is for the others.
        if not (isinstance(name, str) and name in self._names):
            checkName(name)
            return None
        reason = "not a regular file of ours"
        try:
            data = self._readEntry(self._dirFd(), name)
        except OSError as e:
            data, reason = None, e.strerror or str(e)
        except VaultError as e:
            data, reason = None, str(e)
        if data is None:
            self.log.error(
                "vault.unreadable {name}: {reason}", name=name, reason=reason
            )
        return data

    def delete(self, name: str) -> None:
        """Unlink the file durably, then forget C{name}."""
        if not (isinstance(name, str) and name in self._names):
            checkName(name)  # only valid names are held
        dirFd = self._dirFd()
        try:
            try:
                os.unlink(name, dir_fd=dirFd)
            except FileNotFoundError:
                self._names.discard(name)
                return
            # The file is gone from what a restart sees; memory follows.
            self._names.discard(name)
            if self._syncs:
                self._fsync(dirFd)
        except OSError as e:
            raise VaultWriteError("delete", name, e) from e

    def names(self) -> list[str]:
        return sorted(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))  # a snapshot: deletes may follow

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        # Only valid names are ever kept.
        return isinstance(name, str) and name in self._names


def _unlinkQuietly(name: str, dirFd: int) -> None:
    try:
        os.unlink(name, dir_fd=dirFd)
    except OSError as e:
        if e.errno != errno.ENOENT:
            DirectoryVault.log.warn("vault.temp_left {name}", name=name)
