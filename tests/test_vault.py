"""Tests for L{fleetd.vault}: the contract, and the directory mirror [V1] [V2]."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.vault import (
    DirectoryVault,
    IVault,
    MemoryVault,
    VaultError,
    filesystemType,
    parseMountInfo,
)
from fleetd.vault.files import processUmask
from tests.vaults import REFUSED, SECRET, fakeMountInfo

if TYPE_CHECKING:
    _Base = SynchronousTestCase
else:
    _Base = object

BAD_NAMES = [
    "",
    ".hidden",
    ".tmp-abc",
    "-dash",
    "a/b",
    "..",
    "a b",
    "name\n",
    "é",
    "a" * 129,
]

IGNORED = "vault.ignored {name}"


class VaultContractMixin(_Base):
    """Behaviour every L{IVault} shares."""

    def makeVault(self) -> IVault:
        raise NotImplementedError()

    def test_interface_provided(self) -> None:
        """The vault provides L{IVault}."""
        self.assertIsInstance(self.makeVault(), IVault)

    def test_get_absent(self) -> None:
        """An absent name reads as L{None} [V1]."""
        self.assertIsNone(self.makeVault().get("node-1"))

    def test_put_roundTrip(self) -> None:
        """A stored value reads back unchanged [V1]."""
        vault = self.makeVault()
        vault.put("node-1.yaml", SECRET)
        self.assertEqual(vault.get("node-1.yaml"), SECRET)

    def test_put_empty(self) -> None:
        """An empty value is stored, distinct from absence."""
        vault = self.makeVault()
        vault.put("empty", b"")
        self.assertEqual(vault.get("empty"), b"")
        self.assertIn("empty", vault)

    def test_put_overwrite(self) -> None:
        """A second put replaces the first value."""
        vault = self.makeVault()
        vault.put("node-1", b"old")
        vault.put("node-1", b"new")
        self.assertEqual(vault.get("node-1"), b"new")
        self.assertEqual(len(vault), 1)

    def test_delete_present(self) -> None:
        """Delete forgets a stored name and leaves others."""
        vault = self.makeVault()
        vault.put("a", b"1")
        vault.put("b", b"2")
        vault.delete("a")
        self.assertIsNone(vault.get("a"))
        self.assertEqual(vault.names(), ["b"])

    def test_delete_absent(self) -> None:
        """Deleting an absent name is not an error."""
        vault = self.makeVault()
        vault.delete("never-stored")
        self.assertEqual(len(vault), 0)

    def test_names_sorted(self) -> None:
        """Names are listed sorted, whatever the insertion order."""
        vault = self.makeVault()
        for name in ["c", "A", "b.yaml", "a_1"]:
            vault.put(name, b"x")
        self.assertEqual(vault.names(), ["A", "a_1", "b.yaml", "c"])

    def test_iter_everyNameDeletesAllowed(self) -> None:
        """Iterating gives every name once, in no order; deleting meanwhile is safe."""
        vault = self.makeVault()
        for name in ["c", "A", "b.yaml", "a_1"]:
            vault.put(name, b"x")
        seen = []
        for name in vault:
            seen.append(name)
            vault.delete(name)
        self.assertEqual(sorted(seen), ["A", "a_1", "b.yaml", "c"])
        self.assertEqual(len(vault), 0)

    def test_len_contains(self) -> None:
        """Length and membership follow puts and deletes."""
        vault = self.makeVault()
        self.assertEqual((len(vault), "a" in vault), (0, False))
        vault.put("a", b"1")
        self.assertEqual((len(vault), "a" in vault), (1, True))
        vault.delete("a")
        self.assertEqual((len(vault), "a" in vault), (0, False))

    def test_put_badName(self) -> None:
        """Invalid names are refused with a message free of the data [V1]."""
        vault = self.makeVault()
        for name in BAD_NAMES:
            error = self.assertRaises(VaultError, vault.put, name, SECRET)
            self.assertIn("bad vault name", str(error))
            self.assertNotIn("do-not-leak", str(error))
            self.assertNotIn("\n", str(error))
        self.assertEqual(len(vault), 0)

    def test_getDelete_badName(self) -> None:
        """Get and delete refuse invalid names; membership says no."""
        vault = self.makeVault()
        for name in BAD_NAMES:
            self.assertRaises(VaultError, vault.get, name)
            self.assertRaises(VaultError, vault.delete, name)
            self.assertNotIn(name, vault)

    def test_put_longestName(self) -> None:
        """A 128-character name is the longest accepted."""
        vault = self.makeVault()
        vault.put("a" * 128, b"x")
        self.assertEqual(vault.names(), ["a" * 128])


class MemoryVaultTests(VaultContractMixin, SynchronousTestCase):
    """The contract, against L{MemoryVault}."""

    def makeVault(self) -> IVault:
        return MemoryVault()


class DirectoryVaultContractTests(VaultContractMixin, SynchronousTestCase):
    """The contract, against L{DirectoryVault} on a (fake) tmpfs."""

    def makeVault(self) -> IVault:
        path = Path(self.mktemp())
        mountinfo = fakeMountInfo(self, {str(path.resolve()): "tmpfs"})
        return DirectoryVault.open(path, mountinfo=mountinfo)


class DirectoryVaultTests(SynchronousTestCase):
    """Behaviour particular to L{DirectoryVault} [V1] [V2]."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp())
        self.mountinfo = fakeMountInfo(self, {str(self.path.resolve()): "tmpfs"})

    def open(self) -> DirectoryVault:
        return DirectoryVault.open(self.path, mountinfo=self.mountinfo)

    def test_open_rebuildsFromDirectory(self) -> None:
        """Reopening the directory yields the same entries [V2]."""
        vault = self.open()
        vault.put("a", b"1")
        vault.put("b", SECRET)
        vault.put("b", b"2")
        vault.put("c", b"3")
        vault.delete("c")
        reopened = self.open()
        self.assertEqual(reopened.names(), ["a", "b"])
        self.assertEqual((reopened.get("a"), reopened.get("b")), (b"1", b"2"))

    def test_open_removesTornWrite(self) -> None:
        """A leftover temp file is a torn write: ignored and unlinked [V2]."""
        self.open().put("a", b"1")
        (self.path / ".tmp-0123abcd").write_bytes(b"half a conf")
        with capturedLogs() as events:
            reopened = self.open()
        self.assertEqual(reopened.names(), ["a"])
        self.assertEqual(sorted(os.listdir(self.path)), ["a"])
        formats = [e.get("log_format") for e in events]
        self.assertIn("vault.torn_write {name}", formats)

    def test_open_ignoresBadNames(self) -> None:
        """Entries whose names no run uses, and directories, are left alone [V2]."""
        self.open()
        (self.path / "bad name").write_bytes(b"x")
        (self.path / "subdir").mkdir()
        with capturedLogs() as events:
            vault = self.open()
        self.assertEqual(vault.names(), [])
        self.assertEqual(sorted(os.listdir(self.path)), ["bad name", "subdir"])
        ignored = [e["name"] for e in events if e.get("log_format") == IGNORED]
        self.assertEqual(ignored, ["bad name"])
        refused = [e["name"] for e in events if e.get("log_format") == REFUSED]
        self.assertEqual(refused, ["subdir"])

    def test_put_modes(self) -> None:
        """Entries are mode 0600 in a 0700 directory [V1]."""
        vault = self.open()
        vault.put("a", SECRET)
        self.assertEqual(stat.S_IMODE(os.stat(self.path).st_mode), 0o700)
        self.assertEqual(stat.S_IMODE(os.stat(self.path / "a").st_mode), 0o600)

    def test_put_modesDespiteUmask(self) -> None:
        """A permissive umask does not widen entry modes [V1]."""
        old = os.umask(0)
        self.addCleanup(os.umask, old)
        self.open().put("a", b"1")
        self.assertEqual(stat.S_IMODE(os.stat(self.path / "a").st_mode), 0o600)

    def test_put_narrowingUmask_exactMode(self) -> None:
        """
        [V1] An umask that takes bits of 0600 away (the owner could not
        read its own entries back) is undone by a chmod after the create;
        an umask that leaves 0600 alone needs none.
        """
        calls: list[int] = []
        realChmod = os.fchmod

        def fchmod(fd: int, mode: int) -> None:
            calls.append(mode)
            realChmod(fd, mode)

        self.patch(os, "fchmod", fchmod)
        for umask, chmods in ((0o277, [0o600]), (0o022, []), (0o077, [])):
            old = os.umask(umask)
            try:
                calls.clear()
                vault = self.open()
                vault.put("a", b"1")
            finally:
                os.umask(old)
            self.assertEqual(stat.S_IMODE(os.stat(self.path / "a").st_mode), 0o600)
            files = [mode for mode in calls if mode != 0o700]  # not the directory's
            self.assertEqual(files, chmods, oct(umask))

    def test_tempNames_processIdAfterFork(self) -> None:
        """A forked child names its temp files with its own process id (the
        id is kept per process, not asked on every write)."""
        from fleetd.vault import store

        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once
            os.write(write, b"1" if store._pid[0] == os.getpid() else b"0")
            os._exit(0)
        os.close(write)
        answer = os.read(read, 1)
        os.close(read)
        os.waitpid(pid, 0)
        self.assertEqual(answer, b"1")
        self.assertEqual(store._pid[0], os.getpid())

    def test_processUmask(self) -> None:
        """The umask is read from the status file; none found is L{None}."""
        status = Path(self.mktemp())
        status.write_text("Name:\tpython\nUmask:\t0027\nState:\tR\n")
        self.assertEqual(processUmask(status), 0o027)
        status.write_text("Name:\tpython\n")
        self.assertIsNone(processUmask(status))
        self.assertIsNone(processUmask(status.with_name("absent")))

    def test_open_fixesDirectoryMode(self) -> None:
        """A pre-existing 0755 directory is tightened to 0700 [V1]."""
        self.path.mkdir()
        os.chmod(self.path, 0o755)  # noqa: S103
        self.open()
        self.assertEqual(stat.S_IMODE(os.stat(self.path).st_mode), 0o700)

    def test_open_fixesFileMode(self) -> None:
        """An entry found with a wider mode is tightened to 0600 [V1]."""
        self.open()
        (self.path / "a").write_bytes(b"1")
        os.chmod(self.path / "a", 0o644)
        self.assertEqual(self.open().get("a"), b"1")
        self.assertEqual(stat.S_IMODE(os.stat(self.path / "a").st_mode), 0o600)

    def test_open_createsParents(self) -> None:
        """Missing parents are created, 0700 like the directory itself."""
        base = Path(self.mktemp())
        path = base / "run" / "configs"
        mountinfo = fakeMountInfo(self, {str(base.resolve()): "tmpfs"})
        DirectoryVault.open(path, mountinfo=mountinfo).put("a", b"1")
        for directory in (base, base / "run", path):
            self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o700)

    def test_open_notADirectory(self) -> None:
        """A path that is a regular file is refused."""
        self.path.write_bytes(b"")
        error = self.assertRaises(VaultError, self.open)
        self.assertIn("not a directory", str(error))

    def test_open_refusesPersistentFilesystem(self) -> None:
        """A directory that is not on tmpfs/ramfs is refused by default [V1]."""
        mountinfo = fakeMountInfo(self, {})
        error = self.assertRaises(
            VaultError, DirectoryVault.open, self.path, mountinfo=mountinfo
        )
        self.assertIn(str(self.path), str(error))
        self.assertIn("ext4", str(error))

    def test_open_allowAnyFilesystem(self) -> None:
        """C{allowAnyFilesystem} accepts a persistent directory, with a warning."""
        mountinfo = fakeMountInfo(self, {})
        with capturedLogs() as events:
            vault = DirectoryVault.open(
                self.path, allowAnyFilesystem=True, mountinfo=mountinfo
            )
        vault.put("a", b"1")
        self.assertEqual(vault.get("a"), b"1")
        formats = [e.get("log_format") for e in events]
        self.assertIn("vault.persistent_filesystem {path} {fsType}", formats)

    def test_open_acceptsRamfs(self) -> None:
        """ramfs is as good as tmpfs [V1]."""
        mountinfo = fakeMountInfo(self, {str(self.path.resolve()): "ramfs"})
        DirectoryVault.open(self.path, mountinfo=mountinfo).put("a", b"1")

    def test_open_unreadableMountinfo(self) -> None:
        """Without mount information the directory is refused, unless allowed."""
        missing = Path(self.mktemp())
        self.assertRaises(VaultError, DirectoryVault.open, self.path, mountinfo=missing)
        DirectoryVault.open(self.path, allowAnyFilesystem=True, mountinfo=missing)

    def test_put_failedWriteKeepsPrevious(self) -> None:
        """A write failing before the rename keeps the old value, leaves no
        temp file, and survives a reopen [V1] [V2]."""
        self.open().put("a", b"old")

        def failingFsync(fd: int) -> None:
            raise OSError(5, "Input/output error")

        vault = DirectoryVault.open(
            self.path, mountinfo=self.mountinfo, fsync=failingFsync
        )
        error = self.assertRaises(VaultError, vault.put, "a", SECRET)
        self.assertNotIn("do-not-leak", str(error))
        self.assertEqual(vault.get("a"), b"old")
        self.assertEqual(os.listdir(self.path), ["a"])
        self.assertEqual(self.open().get("a"), b"old")

    def test_put_interruptedWrite(self) -> None:
        """Any exception during the write removes the temp file."""
        vault = DirectoryVault.open(
            self.path, mountinfo=self.mountinfo, fsync=self.interrupt
        )
        self.assertRaises(KeyboardInterrupt, vault.put, "a", b"new")
        self.assertNotIn("a", vault)
        self.assertEqual(os.listdir(self.path), [])

    def interrupt(self, fd: int) -> None:
        raise KeyboardInterrupt()

    def test_delete_durable(self) -> None:
        """A deleted entry's file is gone and stays gone on reopen [V2]."""
        vault = self.open()
        vault.put("a", b"1")
        vault.delete("a")
        self.assertFalse((self.path / "a").exists())
        self.assertNotIn("a", self.open())


class MountInfoTests(SynchronousTestCase):
    """Parsing C{/proc/self/mountinfo} to find a path's filesystem [V1]."""

    def test_parseMountInfo_escapes(self) -> None:
        """Octal escapes in mount points are decoded; junk lines are skipped."""
        text = (
            "22 1 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\n"
            "garbage\n"
            "40 22 0:35 / /run/my\\040dir\\134x rw - tmpfs tmpfs rw\n"
            "41 22 0:36 / /mnt rw shared:2 master:3 - ramfs none rw\n"
        )
        self.assertEqual(
            parseMountInfo(text),
            [("/", "ext4"), ("/run/my dir\\x", "tmpfs"), ("/mnt", "ramfs")],
        )

    def test_filesystemType_longestPrefix(self) -> None:
        """The longest mount point containing the path wins, on a path boundary."""
        mountinfo = fakeMountInfo(
            self,
            {
                "/nonexistent-fleetd/run": "tmpfs",
                "/nonexistent-fleetd/run/disk": "xfs",
                "/nonexistent-fleetd/a b": "ramfs",
            },
        )

        def fsType(path: str) -> str:
            return filesystemType(Path(path), mountinfo)

        self.assertEqual(fsType("/nonexistent-fleetd/run/configs"), "tmpfs")
        self.assertEqual(fsType("/nonexistent-fleetd/run"), "tmpfs")
        self.assertEqual(fsType("/nonexistent-fleetd/run/disk/x"), "xfs")
        self.assertEqual(fsType("/nonexistent-fleetd/run/diskette"), "tmpfs")
        self.assertEqual(fsType("/nonexistent-fleetd/running"), "ext4")
        self.assertEqual(fsType("/nonexistent-fleetd/a b/c"), "ramfs")

    def test_filesystemType_stackedMounts(self) -> None:
        """Of two mounts on the same point, the later one is visible."""
        path = Path(self.mktemp())
        path.write_text(
            "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
            "40 22 0:35 / /nonexistent-fleetd rw - tmpfs tmpfs rw\n"
            "41 22 0:36 / /nonexistent-fleetd rw - ext4 /dev/sdb rw\n"
        )
        self.assertEqual(filesystemType(Path("/nonexistent-fleetd/x"), path), "ext4")

    def test_filesystemType_resolvesSymlinks(self) -> None:
        """A symlink is followed to the filesystem it points into."""
        target = Path(self.mktemp())
        target.mkdir()
        link = Path(self.mktemp())
        link.symlink_to(target.resolve())
        mountinfo = fakeMountInfo(self, {str(target.resolve()): "tmpfs"})
        self.assertEqual(filesystemType(link, mountinfo), "tmpfs")


class VolatileSyncTests(SynchronousTestCase):
    """Delivery cost: no fsync where it cannot make anything more durable."""

    def test_tmpfs_skipsFsync(self) -> None:
        """On tmpfs the real fsync is replaced; elsewhere it stays."""
        path = Path(self.mktemp())
        tmpfs = fakeMountInfo(self, {str(path.resolve()): "tmpfs"})
        vault = DirectoryVault.open(path, mountinfo=tmpfs)
        self.assertIsNot(vault._fsync, os.fsync)
        vault.put("a", b"1")
        self.assertEqual(DirectoryVault.open(path, mountinfo=tmpfs).get("a"), b"1")
        other = Path(self.mktemp())
        ext4 = fakeMountInfo(self, {str(other.resolve()): "ext4"})
        persistent = DirectoryVault.open(other, allowAnyFilesystem=True, mountinfo=ext4)
        self.assertIs(persistent._fsync, os.fsync)
