"""
Finding Talos's META partition by its GPT partition name (issue 19,
item 1), in tables util-linux's C{sfdisk} wrote: a Talos-like layout,
a broken primary header, missing and doubled names, no table, and a
4096-byte-sector disk (a loop device).
"""

from __future__ import annotations

import os
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from fleetd.agent import gpt
from tests.metasupport import MiB, loopDevice, makeImage, metaRange, partition


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

    def test_backupHeader_usedWhenPrimaryBroken(self) -> None:
        """A broken primary header (LBA 1): the backup at the last LBA."""
        image = makeImage(self)
        expected = metaRange(image)
        with image.open("r+b") as f:
            f.seek(512 + 16)
            f.write(b"\xff\xff\xff\xff")  # the header's CRC32
        self.assertEqual((self.find(image).offset, self.find(image).length), expected)

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
