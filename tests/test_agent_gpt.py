"""
Finding Talos's META partition by its GPT partition name (issue 19,
item 1), in tables util-linux's C{sfdisk} wrote: a Talos-like layout,
missing and doubled names, no table, and a 4096-byte-sector disk (a loop
device); and refusing tables that are wrong (issue 26, item 5): a
512-byte-sector GPT laid over a 4096-byte-sector disk's, a broken
primary header, primary and backup headers that disagree, and a META
past the disk's end, outside its usable LBAs or overlapping another
partition.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from fleetd.agent import adv, gpt
from tests.gptsupport import (
    BACKUP,
    backingFile,
    byteRange,
    editTable,
    entryName,
    entryRange,
    headerField,
    lbaRange,
    loop4Kn,
    overlay512,
)
from tests.metasupport import (
    MiB,
    loopDevice,
    makeImage,
    metaRange,
    partition,
    runAgent,
)

CODE = b"ABCD-1234-code"


class GPTTests(SynchronousTestCase):
    """Finding META by GPT partition name in tables sfdisk wrote."""

    def find(self, image: Path | str, name: str = "META") -> gpt.Partition:
        fd = os.open(image, os.O_RDONLY)
        try:
            return gpt.findByName(fd, name)
        finally:
            os.close(fd)

    def test_talosLayout_metaWhereSfdiskSaysIt(self) -> None:
        """META's offset and length agree with sfdisk's own reading."""
        image = makeImage(self)
        found = self.find(image)
        self.assertEqual((found.offset, found.length), metaRange(image))
        self.assertEqual((found.index, found.length), (4, MiB))

    def test_noMeta_refused(self) -> None:
        """A table without META names what is missing."""
        image = makeImage(self, layout=(("STATE", "4MiB"),))
        with self.assertRaises(gpt.GPTError) as e:
            self.find(image)
        self.assertEqual(str(e.exception), "no partition named META")

    def test_twoMeta_refused(self) -> None:
        """Two partitions named META: which one is Talos's is not guessed."""
        image = makeImage(self, layout=(("META", "1MiB"), ("META", "1MiB")))
        with self.assertRaises(gpt.GPTError) as e:
            self.find(image)
        self.assertIn("1, 2 are all named META", str(e.exception))

    def test_noTable_refused(self) -> None:
        """A disk without a GPT."""
        image = Path(self.mktemp())
        image.write_bytes(bytes(4 * MiB))
        self.assertRaises(gpt.GPTError, self.find, image)

    def test_sector4096_loopDevice(self) -> None:
        """A 4096-byte-sector disk (a loop device so set up), partitioned
        there by sfdisk: the table is found at 4096 bytes."""
        image = Path(self.mktemp())
        with image.open("wb") as f:
            f.truncate(64 * MiB)
        device = loopDevice(self, image, 4096)
        partition(device)
        found = self.find(device)
        self.assertEqual(found.sectorSize, 4096)
        self.assertEqual((found.offset, found.length), metaRange(device))


def sha256(target: Path | str, offset: int = 0, length: int | None = None) -> str:
    """The SHA-256 of C{length} bytes (or all) of C{target} at C{offset}."""
    with open(target, "rb") as f:
        f.seek(offset)
        return hashlib.sha256(
            f.read() if length is None else f.read(length)
        ).hexdigest()


def agentWrite(case: SynchronousTestCase, disk: Path | str, code: bytes) -> str:
    """C{fleetd-agent meta write --disk DISK 0x0b CODE}; its stderr."""
    status, out, err = runAgent(
        "meta", "write", "--disk", str(disk), "0x0b", code.decode()
    )
    case.assertEqual(status, 0, err)
    case.assertIn("written", out)
    return err


def agentRefused(case: SynchronousTestCase, disk: Path | str) -> str:
    """C{fleetd-agent meta write} refused: exit 1, one stderr line, which
    is returned."""
    status, out, err = runAgent("meta", "write", "--disk", str(disk), "0x0b", "c")
    case.assertEqual((status, out), (1, ""))
    case.assertEqual(err.count("\n"), 1, err)
    case.assertTrue(err.startswith(f"fleetd-agent: meta write: {disk}: "), err)
    return err


class CraftedTableTests(SynchronousTestCase):
    """
    Issue 26 item 5: the GPT is read at the disk's logical block size
    only, its primary header must agree with its backup, and META must lie
    inside the disk's usable LBAs, clear of every other partition.
    """

    def find(
        self, disk: Path | str, imageSectorSize: int = 512, name: str = "META"
    ) -> gpt.Partition:
        fd = os.open(disk, os.O_RDONLY)
        try:
            return gpt.findByName(fd, name, imageSectorSize=imageSectorSize)
        finally:
            os.close(fd)

    def refused(self, disk: Path | str, imageSectorSize: int = 512) -> str:
        with self.assertRaises(gpt.GPTError) as e:
            self.find(disk, imageSectorSize)
        return str(e.exception)

    def test_crafted512On4Kn_realMetaFound(self) -> None:
        """A whole, valid 512-byte-sector GPT in the first and last sectors
        of a 4096-byte-sector disk, whose META lies inside STATE, is not
        read: the disk's own table is, as the kernel and sfdisk read it."""
        device = loop4Kn(self)
        real = metaRange(device)
        state = byteRange(device, "STATE", 4096)
        overlay512(self, device, state[0])
        # What a reader trying 512 first sees (the backing file, read so).
        backing = backingFile(device)
        crafted = self.find(backing, 512)
        self.assertEqual((crafted.offset, crafted.sectorSize), (state[0], 512))
        found = self.find(device)
        self.assertEqual(found.sectorSize, 4096)
        self.assertEqual((found.offset, found.length), real)
        # sfdisk, reading the device, still sees the real table too.
        self.assertEqual((found.offset, found.length), metaRange(device))

    def test_crafted512On4Kn_agentWritesRealMeta(self) -> None:
        """The agent writes the code into the real META (which held an
        older one) and leaves STATE, where the crafted META lies, as it
        was."""
        device = loop4Kn(self)
        agentWrite(self, device, b"old-code")
        state = byteRange(device, "STATE", 4096)
        overlay512(self, device, state[0])
        before = sha256(device, *state)
        self.assertEqual(agentWrite(self, device, CODE), "")
        self.assertEqual(sha256(device, *state), before)
        offset, _ = metaRange(device)
        with open(device, "rb") as f:
            f.seek(offset)
            self.assertEqual(adv.load(f.read(adv.SIZE)).tags, {0x0B: CODE})

    def test_primaryBackupEntriesDisagree_refused(self) -> None:
        """Both headers valid, the backup's entries not the primary's (a
        partition renamed in the backup only): refused, naming both."""
        image = makeImage(self)
        editTable(image, entries=entryName("STATE", "STATX"), which=(BACKUP,))
        last = (64 * MiB) // 512 - 1
        self.assertEqual(
            self.refused(image),
            f"the GPT's primary header (LBA 1) and its backup (LBA {last})"
            " disagree on the partition entries",
        )

    def test_primaryBackupGUIDDisagree_4Kn_refused(self) -> None:
        """On a 4096-byte-sector disk, a backup naming another disk GUID."""
        device = loop4Kn(self)
        editTable(
            device, 4096, header=headerField(56, bytes(range(16))), which=(BACKUP,)
        )
        self.assertIn("disagree on the disk GUID", self.refused(device))
        self.assertIn("disagree on the disk GUID", agentRefused(self, device))

    def test_brokenPrimary_refused(self) -> None:
        """A primary header that fails its CRC is not replaced by the
        backup (which may be a stale one, from before the image): refused,
        saying the backup is valid."""
        image = makeImage(self)
        with image.open("r+b") as f:
            f.seek(512 + 16)
            f.write(b"\xff\xff\xff\xff")  # the header's CRC32
        last = (64 * MiB) // 512 - 1
        self.assertEqual(
            self.refused(image),
            "no valid GPT header at LBA 1 with 512-byte sectors (header CRC"
            f" mismatch); the backup at LBA {last} is valid: repair the table"
            " or write the image again",
        )

    def test_backupMissing_refused(self) -> None:
        """A valid primary header alone (the backup zeroed) is refused."""
        image = makeImage(self)
        with image.open("r+b") as f:
            f.seek(64 * MiB - 512)
            f.write(bytes(512))
        self.assertEqual(
            self.refused(image),
            f"the GPT's backup header at LBA {64 * MiB // 512 - 1} is not valid"
            " (no GPT signature); the primary is not used alone",
        )

    def test_metaOverlapsState_refusedNothingWritten(self) -> None:
        """META's entry (both copies of the table) reaching into STATE:
        refused, and the agent writes nothing."""
        image = makeImage(self)
        first, last = lbaRange(image, "META")
        editTable(image, entries=entryRange("META", first + 1024, last + 1024))
        self.assertEqual(
            self.refused(image), "partition 4 (META) overlaps partition 5 (STATE)"
        )
        before = sha256(image)
        self.assertIn("overlaps partition 5 (STATE)", agentRefused(self, image))
        self.assertEqual(sha256(image), before)

    def test_metaPastDiskEnd_refusedNothingWritten(self) -> None:
        """META's entry running past the disk's last LBA."""
        image = makeImage(self, layout=(("META", "1MiB"),))
        last = (64 * MiB) // 512 - 1
        editTable(image, entries=entryRange("META", last - 1023, last + 1024))
        self.assertEqual(
            self.refused(image), "partition 1 (META) lies past the disk's end"
        )
        before = sha256(image)
        agentRefused(self, image)
        self.assertEqual(sha256(image), before)

    def test_metaOverBackupTable_refusedNothingWritten(self) -> None:
        """META inside the disk but past the last usable LBA, over the
        backup's entry array and header: refused, nothing written."""
        image = makeImage(self, layout=(("META", "1MiB"),))
        last = (64 * MiB) // 512 - 1
        editTable(image, entries=entryRange("META", last - 2047, last))
        self.assertEqual(
            self.refused(image),
            f"partition 1 (META) lies outside the GPT's usable LBAs 2048-{last - 33}",
        )
        before = sha256(image)
        agentRefused(self, image)
        self.assertEqual(sha256(image), before)

    def test_imageOnLargerDisk_backupAtImageEnd(self) -> None:
        """An image written onto a larger disk (as image2disk does) keeps
        its backup header at the image's end; a stale table's backup at the
        disk's end (a previous install) is not read."""
        image = makeImage(self, size=32 * MiB)
        expected = metaRange(image)
        stale = makeImage(self, size=64 * MiB, layout=(("META", "4MiB"),))
        with image.open("r+b") as f:
            f.truncate(64 * MiB)
            f.seek(64 * MiB - 33 * 512)
            f.write(stale.read_bytes()[-33 * 512 :])
        found = self.find(image)
        self.assertEqual((found.offset, found.length), expected)

    def test_backupPastDiskEnd_refused(self) -> None:
        """A table for a larger disk (an image cut short): its backup
        header would lie past the disk's end."""
        image = makeImage(self)
        with image.open("r+b") as f:
            f.truncate(32 * MiB)
        self.assertEqual(
            self.refused(image),
            f"the GPT's primary header puts its backup at LBA {64 * MiB // 512 - 1},"
            f" past the disk's last LBA {32 * MiB // 512 - 1}",
        )

    def test_imageFile_512UnlessToldOtherwise(self) -> None:
        """A disk image file has no logical block size: 512 unless the
        caller says otherwise. A 4096-byte-sector table in one is refused
        at 512, with a hint, and found when asked for 4096."""
        device = loop4Kn(self)
        expected = metaRange(device)
        backing = backingFile(device)
        self.assertEqual(
            self.refused(backing),
            "no valid GPT header at LBA 1 with 512-byte sectors (no GPT"
            " signature); there is one for 4096-byte sectors, and an image file"
            " is read with 512-byte sectors",
        )
        found = self.find(backing, 4096)
        self.assertEqual((found.offset, found.length), expected)
