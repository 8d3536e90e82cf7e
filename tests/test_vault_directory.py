"""
The vault directory is opened once, without following links, only when
fleetd or root controls every directory on the way; entries that are not
fleetd's regular files are never loaded [V1] [V2] (issue 8, item 8).

Some tests hand a file or directory to another uid with C{os.chown}: they
need root, as the test suite runs here and in CI. L{giveAway} says so
plainly when that does not hold, rather than skipping.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase, TestCase

from fleetd.config import ConfigError
from fleetd.prepare import prepare
from fleetd.vault import DirectoryVault, VaultError
from tests.daemonsupport import DaemonTestMixin
from tests.vaults import REFUSED, SECRET, fakeMountInfo

OTHER_UID = 54321
PLANTED = b"machine:\n  token: planted-by-someone-else\n"


def giveAway(test: SynchronousTestCase, path: Path) -> None:
    """Make C{path} (not what it links to) belong to another uid; needs root."""
    if os.geteuid() != 0:
        test.fail("this test hands files to another uid with os.chown: run it as root")
    os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)


def openFds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


class VaultPathTests(SynchronousTestCase):
    """Who controls the path to the vault directory [V1] (issue 8, item 8)."""

    def setUp(self) -> None:
        self.base = Path(self.mktemp()).resolve()
        self.base.mkdir()
        self.path = self.base / "configs"
        self.mountinfo = fakeMountInfo(self, {str(self.base): "tmpfs"})

    def open(self, path: Path | None = None) -> DirectoryVault:
        vault = DirectoryVault.open(path or self.path, mountinfo=self.mountinfo)
        self.addCleanup(vault.close)
        return vault

    def refused(self, path: Path | None = None) -> str:
        error = self.assertRaises(VaultError, self.open, path)
        self.assertNotIn("\n", str(error))
        return str(error)

    def plant(self, directory: Path) -> None:
        """What the attacker leaves where fleetd would look: a ready config."""
        (directory / "run-1.config").write_bytes(PLANTED)

    def test_symlinkedVaultDirectory_plantedFileNotLoaded(self) -> None:
        """
        [V1] The verified attack: the vault path is a link to a directory
        someone else filled. fleetd refuses it, names the link, loads nothing.
        """
        elsewhere = self.base / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        self.plant(elsewhere)
        self.path.symlink_to(elsewhere)
        error = self.refused()
        self.assertEqual(
            error,
            f"vault path {self.path} is a symbolic link; configure the real path "
            "(no link is followed on the way to the vault)",
        )

    def test_symlinkedAncestor_refused(self) -> None:
        """[V1] A link anywhere on the way is refused, not only the last component."""
        real = self.base / "real"
        (real / "configs").mkdir(parents=True, mode=0o700)
        self.plant(real / "configs")
        link = self.base / "run"
        link.symlink_to(real)
        error = self.refused(link / "configs")
        self.assertIn(f"vault path {link} is a symbolic link", error)

    def test_worldWritableParent_refused(self) -> None:
        """
        [V1] The verified attack: a parent anyone can write into (not sticky)
        lets them swap the vault; refused, naming the parent and its mode.
        """
        parent = self.base / "run"
        (parent / "configs").mkdir(parents=True, mode=0o700)
        self.plant(parent / "configs")
        os.chmod(parent, 0o777)  # noqa: S103
        self.assertEqual(
            self.refused(parent / "configs"),
            f"vault path {parent} is writable by group or others (mode 0777) "
            "and not sticky",
        )

    def test_groupWritableParent_refused(self) -> None:
        """[V1] Group-writable is as unsafe as world-writable for an ancestor."""
        parent = self.base / "run"
        parent.mkdir()
        os.chmod(parent, 0o775)  # noqa: S103
        self.assertIn("(mode 0775) and not sticky", self.refused(parent / "configs"))

    def test_stickyParent_ownVaultAccepted(self) -> None:
        """
        [V1] A sticky world-writable ancestor (like /dev/shm) is fine when the
        next component is ours: others cannot rename or remove it.
        """
        shm = self.base / "shm"
        shm.mkdir()
        os.chmod(shm, 0o1777)  # noqa: S103
        vault = self.open(shm / "fleetd-dev" / "configs")
        vault.put("a", b"1")
        self.assertEqual(vault.get("a"), b"1")

    def test_stickyParent_foreignComponent_refused(self) -> None:
        """
        [V1] Under a sticky world-writable directory, a component another user
        pre-created (their /dev/shm/fleetd-dev) is refused, naming its owner.
        Runs as root (chown).
        """
        shm = self.base / "shm"
        (shm / "fleetd-dev" / "configs").mkdir(parents=True, mode=0o700)
        self.plant(shm / "fleetd-dev" / "configs")
        os.chmod(shm, 0o1777)  # noqa: S103
        giveAway(self, shm / "fleetd-dev")
        self.assertEqual(
            self.refused(shm / "fleetd-dev" / "configs"),
            f"vault path {shm / 'fleetd-dev'} is owned by uid {OTHER_UID}, "
            f"not root or fleetd's uid {os.geteuid()}",
        )

    def test_ancestorOwnedBySomeoneElse_refused(self) -> None:
        """[V1] An ancestor owned by another user is refused, even 0755. As root."""
        parent = self.base / "run"
        parent.mkdir(mode=0o755)
        giveAway(self, parent)
        self.assertIn(f"is owned by uid {OTHER_UID}", self.refused(parent / "configs"))

    def test_vaultOwnedBySomeoneElse_refused(self) -> None:
        """[V1] A vault directory that is not fleetd's is refused. As root (chown)."""
        self.path.mkdir(mode=0o700)
        self.plant(self.path)
        giveAway(self, self.path)
        self.assertEqual(
            self.refused(),
            f"vault directory {self.path} is owned by uid {OTHER_UID}, "
            f"not fleetd's uid {os.geteuid()}",
        )

    def test_worldWritableVault_refused(self) -> None:
        """[V1] A pre-existing vault directory others could write into is refused."""
        self.path.mkdir()
        os.chmod(self.path, 0o777)  # noqa: S103
        self.assertEqual(
            self.refused(),
            f"vault directory {self.path} is writable by group or others "
            "(mode 0777) and may hold planted files; remove it",
        )

    def test_createdVault_mode0700DespiteUmask(self) -> None:
        """[V1] A vault directory fleetd creates is 0700 whatever the umask."""
        old = os.umask(0o277)
        try:
            self.open()
        finally:
            os.umask(old)
        self.assertEqual(stat.S_IMODE(os.stat(self.path).st_mode), 0o700)

    def test_ancestorNotADirectory_refused(self) -> None:
        """[V1] A file where a directory should be is named."""
        (self.base / "run").write_bytes(b"")
        self.assertEqual(
            self.refused(self.base / "run" / "configs"),
            f"vault path {self.base / 'run'} is not a directory",
        )

    def test_writesFollowTheOpenedDirectory(self) -> None:
        """
        [V1] The directory is opened once: after it is moved away and
        something else put at its path, writes still land in the directory
        that was checked, never in what now sits at the path.
        """
        vault = self.open()
        moved = self.base / "moved"
        self.path.rename(moved)
        impostor = self.base / "impostor"
        impostor.mkdir()
        self.path.symlink_to(impostor)
        vault.put("a", SECRET)
        vault.delete("missing")
        self.assertEqual(os.listdir(impostor), [])
        self.assertEqual(os.listdir(moved), ["a"])

    def test_close_releasesDescriptor(self) -> None:
        """
        [V1] close() releases the directory descriptor; later writes are a
        clear VaultError, and reads find nothing (the contents were never
        copied into fleetd's heap: the vault reads its files when asked).
        """
        before = openFds()
        vault = DirectoryVault.open(self.path, mountinfo=self.mountinfo)
        vault.put("a", b"1")
        self.assertEqual(len(openFds() - before), 1)
        vault.close()
        vault.close()
        self.assertEqual(openFds() - before, set())
        error = self.assertRaises(VaultError, vault.put, "b", b"2")
        self.assertEqual(str(error), f"vault {self.path} is closed")
        self.assertRaises(VaultError, vault.delete, "a")
        self.assertIsNone(vault.get("a"))

    def test_get_readsTheFileWithTheOpenChecks(self) -> None:
        """
        [V1] [V2] The vault keeps names, not contents: get reads the file
        when asked, with the checks open applies. A file swapped for a
        link after open is not followed, and one that vanished is None;
        both are logged, neither raises.
        """
        vault = self.open()
        vault.put("a", SECRET)
        vault.put("b", b"2")
        reopened = self.open()
        self.assertEqual(reopened.get("a"), SECRET)
        elsewhere = self.base / "elsewhere"
        elsewhere.write_bytes(PLANTED)
        os.unlink(self.path / "a")
        os.symlink(elsewhere, self.path / "a")
        os.unlink(self.path / "b")
        with capturedLogs() as events:
            self.assertIsNone(reopened.get("a"))
            self.assertIsNone(reopened.get("b"))
        self.assertEqual(
            [e["name"] for e in events if e["log_format"].startswith("vault.unread")],
            ["a", "b"],
        )

    def test_refusedOpen_leavesNoDescriptor(self) -> None:
        """[V1] A vault refused after its directory was opened closes it."""
        before = openFds()
        self.assertRaises(
            VaultError,
            DirectoryVault.open,
            self.path,
            mountinfo=fakeMountInfo(self, {}),
        )
        self.assertEqual(openFds() - before, set())


class VaultEntryTests(SynchronousTestCase):
    """What the vault loads from its directory [V2] (issue 8, item 8)."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp()).resolve()
        self.mountinfo = fakeMountInfo(self, {str(self.path): "tmpfs"})
        self.open().put("run-0.config", SECRET)

    def open(self) -> DirectoryVault:
        vault = DirectoryVault.open(self.path, mountinfo=self.mountinfo)
        self.addCleanup(vault.close)
        return vault

    def reopen(self) -> tuple[DirectoryVault, list[dict[str, Any]]]:
        with capturedLogs() as events:
            vault = self.open()
        return vault, [e for e in events if e.get("log_format") == REFUSED]

    def test_symlinkInside_notLoadedAndRemoved(self) -> None:
        """[V2] A link inside the vault is never followed: refused, unlinked, warned."""
        target = Path(self.mktemp())
        target.write_bytes(PLANTED)
        (self.path / "run-1.config").symlink_to(target.resolve())
        vault, refused = self.reopen()
        self.assertEqual(vault.names(), ["run-0.config"])
        self.assertEqual(os.listdir(self.path), ["run-0.config"])
        self.assertEqual(target.read_bytes(), PLANTED)
        self.assertEqual(
            [(e["name"], e["kind"], e["removed"]) for e in refused],
            [("run-1.config", "symlink", True)],
        )

    def test_foreignFile_notLoadedAndRemoved(self) -> None:
        """[V2] A regular file owned by another uid is refused, removed. As root."""
        planted = self.path / "run-1.config"
        planted.write_bytes(PLANTED)
        os.chmod(planted, 0o600)
        giveAway(self, planted)
        vault, refused = self.reopen()
        self.assertNotIn("run-1.config", vault)
        self.assertFalse(planted.exists())
        self.assertEqual(
            [(e["name"], e["kind"], e["owner"]) for e in refused],
            [("run-1.config", "file", OTHER_UID)],
        )

    def test_fifo_notLoaded(self) -> None:
        """[V2] A FIFO with an entry's name is refused without blocking the load."""
        os.mkfifo(self.path / "run-1.config", 0o600)
        vault, refused = self.reopen()
        self.assertEqual(vault.names(), ["run-0.config"])
        self.assertEqual([e["kind"] for e in refused], ["special"])
        self.assertEqual(os.listdir(self.path), ["run-0.config"])

    def test_foreignTempFile_notTakenForATornWrite(self) -> None:
        """[V2] A temp-named file that is not ours is refused like others. As root."""
        planted = self.path / ".tmp-0123abcd"
        planted.write_bytes(PLANTED)
        giveAway(self, planted)
        vault, refused = self.reopen()
        self.assertEqual(vault.names(), ["run-0.config"])
        self.assertEqual([e["name"] for e in refused], [".tmp-0123abcd"])


class CheckLaterTests(SynchronousTestCase):
    """
    C{DirectoryVault.open(check=False)}: names listed at once, every entry
    looked at by L{DirectoryVault.inspect} (read-only, any thread) and put
    right by L{DirectoryVault.settle} (issue 17 item 17: the daemon
    overlaps the 100,000 lstats of 50,000 runs with its database reads).
    """

    def setUp(self) -> None:
        self.path = Path(self.mktemp()).resolve()
        self.mountinfo = fakeMountInfo(self, {str(self.path): "tmpfs"})
        vault = DirectoryVault.open(self.path, mountinfo=self.mountinfo)
        vault.put("run-0.config", SECRET)
        vault.close()
        self.foreign = self.path / "run-1.config"
        self.foreign.write_bytes(PLANTED)
        os.chmod(self.foreign, 0o600)
        giveAway(self, self.foreign)
        self.loose = self.path / "run-2.config"
        self.loose.write_bytes(SECRET)
        os.chmod(self.loose, 0o644)
        (self.path / ".tmp-1-2").write_bytes(b"torn")

    def openLater(self) -> DirectoryVault:
        vault = DirectoryVault.open(self.path, mountinfo=self.mountinfo, check=False)
        self.addCleanup(vault.close)
        return vault

    def test_inspect_changesNothing(self) -> None:
        """Inspecting names what needs a look and leaves the directory alone."""
        vault = self.openLater()
        before = sorted(os.listdir(self.path))
        found = vault.inspect()
        self.assertEqual(sorted(found), [".tmp-1-2", "run-1.config", "run-2.config"])
        self.assertEqual(sorted(os.listdir(self.path)), before)
        self.assertEqual(os.stat(self.loose).st_mode & 0o777, 0o644)

    def test_settle_refusesFixesAndRemovesTornWrites(self) -> None:
        """After settle, the vault holds what open(check=True) would have kept."""
        vault = self.openLater()
        with capturedLogs() as events:
            vault.settle(vault.inspect())
        self.assertEqual(vault.names(), ["run-0.config", "run-2.config"])
        self.assertEqual(sorted(os.listdir(self.path)), vault.names())
        self.assertEqual(os.stat(self.loose).st_mode & 0o777, 0o600)
        refused = [e["name"] for e in events if e.get("log_format") == REFUSED]
        self.assertEqual(refused, ["run-1.config"])
        self.assertIn("vault.loaded {entries}", [e.get("log_format") for e in events])

    def test_settle_fileReplacedSinceInspect_keptWhenOurs(self) -> None:
        """A file put by fleetd between inspect and settle is looked at again."""
        vault = self.openLater()
        found = vault.inspect()
        vault.put("run-1.config", SECRET)  # fleetd's own file now
        vault.settle(found)
        self.assertIn("run-1.config", vault)
        self.assertEqual(vault.get("run-1.config"), SECRET)


class DaemonVaultTests(DaemonTestMixin, TestCase):
    """The daemon holds the vault directory open while it runs [V1]."""

    def test_stop_closesVault(self) -> Deferred[None]:
        """[V1] Stopping fleetd closes the vault directory; no write follows."""
        self.makeSettings()
        service = self.startDaemon()
        vault = service.vault
        vault.put("a", b"1")

        def stopped(_: object) -> None:
            self.assertRaises(VaultError, vault.put, "b", b"2")

        d: Deferred[None] = Deferred.fromCoroutine(self._stop(service))
        return d.addCallback(stopped)

    async def _stop(self, service: Any) -> None:
        await service.stopService()

    def test_prepareFailsAfterVault_closesIt(self) -> None:
        """[V1] When start-up fails after the vault was opened, it is closed."""
        self.makeSettings()
        self.settings.state.parent.mkdir(parents=True, exist_ok=True)
        self.settings.state.write_bytes(b"not a directory")
        before = openFds()
        error = self.assertRaises(ConfigError, prepare, self.settings)
        self.assertEqual(error.key, "paths.state")
        self.assertEqual(openFds() - before, set())

    def test_prepare_unsafeVault_namesKey(self) -> None:
        """[V1] An unsafe vault path stops start-up with one line under paths.vault."""
        self.makeSettings()
        self.settings.vault.parent.mkdir(parents=True, exist_ok=True)
        self.settings.vault.symlink_to(self.directory)
        error = self.assertRaises(ConfigError, prepare, self.settings)
        self.assertEqual(error.key, "paths.vault")
        self.assertIn("is a symbolic link", str(error))
