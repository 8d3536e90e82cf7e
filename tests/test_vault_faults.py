"""
A vault write that fails (a full tmpfs) is one clear L{VaultWriteError}
and leaves nothing behind [V1]; L{FaultyVault} reproduces it for tests of
the layers above (issue 8, items 3 and 8).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from fleetd.vault import (
    DirectoryVault,
    IClosableVault,
    IVault,
    MemoryVault,
    VaultError,
    VaultWriteError,
)
from tests.test_vault import VaultContractMixin
from tests.vaults import SECRET, FaultyVault, fakeMountInfo

FULL = (
    "cannot write vault entry a: "
    "the vault's filesystem is full (No space left on device)"
)


class FullAfter:
    """An C{os.write} that writes C{room} bytes in all, then fails with ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __call__(self, fd: int, data: memoryview) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = os.write(fd, data[: self.room])
        self.room -= written
        return written


class DirectoryVaultWriteFailureTests(SynchronousTestCase):
    """A failing write through the real directory code [V1]."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp()).resolve()
        self.mountinfo = fakeMountInfo(self, {str(self.path): "tmpfs"})
        first = self.open()
        first.put("a", b"old")
        first.close()

    def open(self, room: int | None = None) -> DirectoryVault:
        vault = DirectoryVault.open(
            self.path,
            mountinfo=self.mountinfo,
            write=os.write if room is None else FullAfter(room),
        )
        self.addCleanup(vault.close)
        return vault

    def assertUnchanged(self, vault: DirectoryVault) -> None:
        self.assertEqual(vault.get("a"), b"old")
        self.assertEqual(os.listdir(self.path), ["a"])
        self.assertEqual(self.open().get("a"), b"old")

    def test_put_full_clearErrorNoTempFile(self) -> None:
        """
        [V1] A tmpfs full half-way through a write raises VaultWriteError
        (ENOSPC, one line, no secret), keeps the old value, leaves no temp file.
        """
        vault = self.open(room=len(SECRET) // 2)
        error = self.assertRaises(VaultWriteError, vault.put, "a", SECRET)
        self.assertEqual(str(error), FULL)
        self.assertEqual((error.errno, error.name), (errno.ENOSPC, "a"))
        self.assertIsInstance(error, VaultError)
        self.assertUnchanged(vault)

    def test_put_fullAtOnce(self) -> None:
        """[V1] A tmpfs with no room at all fails the same way, nothing left behind."""
        vault = self.open(room=0)
        self.assertEqual(str(self.assertRaises(VaultError, vault.put, "a", b"x")), FULL)
        self.assertUnchanged(vault)

    def test_delete_failure(self) -> None:
        """[V1] A delete whose directory flush fails is a VaultWriteError too."""

        def failingFsync(fd: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        vault = DirectoryVault.open(
            self.path, mountinfo=self.mountinfo, fsync=failingFsync
        )
        self.addCleanup(vault.close)
        error = self.assertRaises(VaultWriteError, vault.delete, "a")
        self.assertEqual(str(error), "cannot delete vault entry a: Input/output error")
        self.assertEqual(error.errno, errno.EIO)


class FaultyVaultContractTests(VaultContractMixin, SynchronousTestCase):
    """The contract, against L{FaultyVault} with no fault switched on."""

    def makeVault(self) -> IVault:
        return FaultyVault(MemoryVault())


class FaultyVaultTests(SynchronousTestCase):
    """L{FaultyVault} fails as the real vault does, and only when told [V1]."""

    def setUp(self) -> None:
        self.inner = MemoryVault([("a", b"old")])
        self.vault = FaultyVault(self.inner)

    def test_failWrites_likeAFullTmpfs(self) -> None:
        """
        [V1] An injected ENOSPC is the very error a full tmpfs gives the real
        vault (same type, errno and line), and the wrapped vault is untouched.
        """
        self.vault.failWrites()
        error = self.assertRaises(VaultWriteError, self.vault.put, "a", SECRET)
        self.assertEqual(str(error), FULL)
        self.assertEqual(error.errno, errno.ENOSPC)
        self.assertEqual(self.inner.get("a"), b"old")
        self.assertEqual((self.vault.failures, self.vault.refused), (1, ["a"]))

    def test_failWrites_onlyNamed(self) -> None:
        """[V1] A name filter fails only those writes (e.g. served marks)."""
        self.vault.failWrites(names=lambda name: name.endswith(".served"))
        self.vault.put("run-1.config", b"c")
        self.assertRaises(VaultWriteError, self.vault.put, "run-1.served", b"m")
        self.assertEqual(self.inner.names(), ["a", "run-1.config"])

    def test_failDeletes_thenHeal(self) -> None:
        """[V1] Deletes fail when told and pass again after heal()."""
        self.vault.failDeletes(errno.EIO)
        error = self.assertRaises(VaultWriteError, self.vault.delete, "a")
        self.assertEqual(str(error), "cannot delete vault entry a: Input/output error")
        self.assertIn("a", self.inner)
        self.vault.heal()
        self.vault.delete("a")
        self.vault.put("b", b"1")
        self.assertEqual(self.inner.names(), ["b"])

    def test_close_reachesDirectoryVault(self) -> None:
        """[V1] Wrapping a DirectoryVault keeps it closable through the wrapper."""
        path = Path(self.mktemp()).resolve()
        inner = DirectoryVault.open(
            path, mountinfo=fakeMountInfo(self, {str(path): "tmpfs"})
        )
        vault = FaultyVault(inner)
        self.assertIsInstance(vault, IClosableVault)
        vault.close()
        self.assertTrue(inner.closed)
