"""
C{fleetd-agent meta write|read} (issue 19, item 1): Talos's META on a
disk that is not booted.

Where the format and the vectors come from (C{siderolabs/talos} at
C{ad8823176e75b9cd07647ddde13c34f2ab77c663}, whose C{go.mod} requires
C{github.com/siderolabs/go-adv v1.0.0}):

  - the format: C{siderolabs/go-adv} C{adv/talos/talos.go} (commit
    C{3818a65435881c8d151635bfd7003ce63928124d}), identical in the
    Marshal/Unmarshal of a 256 KiB copy to Talos's own copy before it
    moved out, C{internal/pkg/meta/internal/adv/talos/talos.go} at Talos
    commit C{40e66eac7d6ef925f937de024b8d4fa9efdda231} (the parent of
    C{a6edcf6f3} "chore: move out adv library"); C{End = 0} from
    C{adv/internal/constants/constants.go};
  - how META is read and written: C{internal/pkg/meta/meta.go}
    (C{talos.NewADV} over the partition, C{Flush} writes C{Bytes()} at
    offset 0 and a syslinux ADV in the last 1 KiB);
  - the keys: C{pkg/machinery/meta/constants.go} (C{DownloadURLCode} =
    0x0b); the label: C{pkg/machinery/constants/constants.go}
    (C{MetaPartitionLabel = "META"}); its size: C{METASize()} = 1 MiB in
    C{pkg/machinery/imager/quirks/partitions.go};
  - the vectors: the pinned blobs below are what Talos's own C{Marshal}
    and C{Bytes()} produced, run once (Go 1.19) from the file above with
    only its two C{siderolabs/gen} helpers and C{slices.Clone} replaced
    by plain Go: key 0x0b holding a code; the three tags of Talos's
    C{TestMarshalUnmarshal} (C{talos_test.go}: Reserved1-3 = 3, 4, 5 with
    C{value1}-C{value3}; Go emits map order, the run kept the ascending
    one); an empty ADV. Talos's C{NewADV} also read back the partition a
    C{meta write} left (keys 0x0a and 0x0b), with no error.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from fleetd.agent import adv
from tests.metasupport import (
    MiB,
    loopDevice,
    makeImage,
    metaRange,
    partition,
    runAgent,
)

CODE = b"ABCD-1234-code"
# Talos Marshal()/Bytes() of {0x0b: CODE}: SHA-256 of one copy, of both, and
# the copy's embedded checksum (bytes -36..-4).
CODE_COPY_SHA256 = "d312b41247b051bb9f8ee22d6e599fe4739e55cbc07af3709e53140b7a672b99"
CODE_BYTES_SHA256 = "bd99c4df663d1ff27e89dbb3ad665fe349064a51c8dc2315479fe9cd3dbe9dae"
CODE_CHECKSUM = "089530c5bd3352ec3cf6b9fe1b7659e12070e15045d647a3792aaa4a6ae628f9"
# talos_test.go TestMarshalUnmarshal: adv.Reserved1..3 (constants.go: 3, 4, 5).
TALOS_TEST_TAGS = {3: b"value1", 4: b"value2", 5: b"value3"}
TEST_TAGS_BYTES_SHA256 = (
    "f28becf804b89fd6239fced631afb9f7639ca3478741a11d4e559ee84fa10b80"
)
TEST_TAGS_CHECKSUM = "04e20b134ae9e8780a179eca5a742331c01529e865e6d13b82f5c5ac462d0c4b"
EMPTY_BYTES_SHA256 = "953fd0a895d7c59e2f15b9dd7edccab926df18b468792bd7f0b572fb0cdec872"
EMPTY_CHECKSUM = "e7a327df2cfb2c3010ac1a387e9573d46ea52cac7f25db80ad8fbb41aceabf70"
# talos_test.go's recoverable corruptions: [offset, length] runs zeroed.
TALOS_CORRUPTIONS = (
    ((0, 2),),
    ((30, 1000),),
    ((8, 4), (40, 2)),
    ((0, adv.LENGTH),),
)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ADVVectorTests(SynchronousTestCase):
    """Byte-for-byte agreement with Talos's C{adv/talos} Marshal."""

    def test_constants_asInTalos(self) -> None:
        """Sizes and magics are talos.go's (lines 23-33)."""
        self.assertEqual(
            (adv.LENGTH, adv.DATA_LENGTH, adv.SIZE, adv.MAGIC1, adv.MAGIC2),
            (262144, 262104, 524288, 0x5A4B3C2D, 0xA5B4C3D2),
        )

    def test_code_talosBytes(self) -> None:
        """The code as key 0x0b serializes to exactly Talos's Bytes()."""
        blob = adv.serialize({0x0B: CODE})
        self.assertEqual(sha256(blob), CODE_BYTES_SHA256)
        self.assertEqual(sha256(blob[: adv.LENGTH]), CODE_COPY_SHA256)
        # magic1, tag 0x0b, size 14, the value, then zeros up to the trailer.
        head = struct.pack(">III", adv.MAGIC1, 0x0B, len(CODE)) + CODE
        self.assertEqual(blob[: len(head)], head)
        self.assertFalse(any(blob[len(head) : adv.LENGTH - 36]))
        self.assertEqual(blob[adv.LENGTH - 36 : adv.LENGTH - 4].hex(), CODE_CHECKSUM)
        self.assertEqual(blob[adv.LENGTH - 4 : adv.LENGTH], bytes.fromhex("a5b4c3d2"))
        self.assertEqual(blob[: adv.LENGTH], blob[adv.LENGTH :])

    def test_checksum_wholeCopyWithChecksumZeroed(self) -> None:
        """The checksum is SHA-256 of the whole 256 KiB copy with the
        checksum field zero (talos.go Marshal: hash before copying it in)."""
        copy = bytearray(adv.serializeCopy({0x0B: CODE}))
        copy[adv.LENGTH - 36 : adv.LENGTH - 4] = bytes(32)
        self.assertEqual(hashlib.sha256(copy).hexdigest(), CODE_CHECKSUM)

    def test_talosTestTags_talosBytes(self) -> None:
        """Talos's own test's three tags serialize to Talos's Bytes()."""
        blob = adv.serialize(TALOS_TEST_TAGS)
        self.assertEqual(sha256(blob), TEST_TAGS_BYTES_SHA256)
        self.assertEqual(
            blob[adv.LENGTH - 36 : adv.LENGTH - 4].hex(), TEST_TAGS_CHECKSUM
        )
        self.assertEqual(adv.parseCopy(blob[: adv.LENGTH]), TALOS_TEST_TAGS)

    def test_empty_talosBytes(self) -> None:
        """An empty META serializes to Talos's Bytes() of an empty ADV."""
        blob = adv.serialize({})
        self.assertEqual(sha256(blob), EMPTY_BYTES_SHA256)
        self.assertEqual(blob[adv.LENGTH - 36 : adv.LENGTH - 4].hex(), EMPTY_CHECKSUM)
        self.assertEqual(adv.parseCopy(blob[: adv.LENGTH]), {})

    def test_talosCorruptions_readFromSecondCopy(self) -> None:
        """Each corruption of talos_test.go, in the first copy, leaves the
        keys readable from the second, and says copy 1 is bad."""
        blob = adv.serialize(TALOS_TEST_TAGS)
        for runs in TALOS_CORRUPTIONS:
            corrupted = bytearray(blob)
            for offset, length in runs:
                corrupted[offset : offset + length] = bytes(length)
            loaded = adv.load(bytes(corrupted))
            self.assertEqual(loaded.tags, TALOS_TEST_TAGS, runs)
            self.assertEqual(loaded.states[1], adv.CopyState.GOOD)
            self.assertIsNot(loaded.states[0], adv.CopyState.GOOD, runs)

    def test_anyOrder_readAlike(self) -> None:
        """Talos writes tags in map order; a copy in another order (built
        by hand here) reads the same."""
        buf = bytearray(adv.LENGTH)
        buf[:4] = adv.MAGIC1.to_bytes(4, "big")
        buf[-4:] = adv.MAGIC2.to_bytes(4, "big")
        offset = 4
        for tag in (5, 3, 4):
            value = TALOS_TEST_TAGS[tag]
            buf[offset : offset + 8 + len(value)] = (
                struct.pack(">II", tag, len(value)) + value
            )
            offset += 8 + len(value)
        buf[adv.LENGTH - 36 : adv.LENGTH - 4] = hashlib.sha256(buf).digest()
        self.assertEqual(adv.parseCopy(bytes(buf)), TALOS_TEST_TAGS)


class ADVTests(SynchronousTestCase):
    """Parsing, capacity and the two copies' states."""

    def test_full_exactFitAccepted_oneMoreRefused(self) -> None:
        """A value of DATA_LENGTH-8 bytes fits (Talos's Marshal takes it);
        one byte more is 'META is full' (Talos: 'adv: overflow 1 bytes')."""
        fits = {0x0B: b"x" * (adv.DATA_LENGTH - 8)}
        self.assertEqual(adv.parseCopy(adv.serializeCopy(fits)), fits)
        with self.assertRaises(adv.ADVError) as e:
            adv.serializeCopy({0x0B: b"x" * (adv.DATA_LENGTH - 7)})
        self.assertIn("META is full", str(e.exception))

    def test_valuePastEnd_refused(self) -> None:
        """A size running past the data area makes the copy bad."""
        buf = bytearray(adv.serializeCopy({0x0B: CODE}))
        buf[8:12] = (adv.LENGTH).to_bytes(4, "big")
        buf[adv.LENGTH - 36 : adv.LENGTH - 4] = bytes(32)
        buf[adv.LENGTH - 36 : adv.LENGTH - 4] = hashlib.sha256(buf).digest()
        with self.assertRaises(adv.ADVError):
            adv.parseCopy(bytes(buf))

    def test_states_blankCorruptGood(self) -> None:
        """Zeros are a META never written; garbage is corrupt."""
        blank = adv.load(bytes(adv.SIZE))
        self.assertTrue(blank.fresh)
        self.assertIsNone(blank.tags)
        garbage = adv.load(b"\x01" * adv.SIZE)
        self.assertFalse(garbage.fresh)
        self.assertEqual(garbage.states, (adv.CopyState.CORRUPT,) * 2)

    def test_differ_firstCopyWins(self) -> None:
        """Two good copies that differ: the first is used, as Talos does."""
        area = adv.serializeCopy({0x0B: b"new"}) + adv.serializeCopy({0x0B: b"old"})
        loaded = adv.load(area)
        self.assertEqual(loaded.tags, {0x0B: b"new"})
        self.assertTrue(loaded.differ)

    def test_parseKey_likeTalosctl(self) -> None:
        """Keys parse as Go's ParseUint(key, 0, 8); 0 and >0xff refused."""
        for text in ("0x0b", "0xb", "11", "0XB", "0o13", "0b1011"):
            self.assertEqual(adv.parseKey(text), 0x0B, text)
        for text in ("0", "256", "0x100", "-1", "eleven", ""):
            self.assertRaises(adv.ADVError, adv.parseKey, text)

    @settings(max_examples=40, deadline=None)
    @given(st.dictionaries(st.integers(1, 255), st.binary(max_size=300), max_size=12))
    def test_roundTrip_property(self, tags: dict[int, bytes]) -> None:
        """Whatever fits serializes to two equal copies that parse back."""
        blob = adv.serialize(tags)
        loaded = adv.load(blob)
        self.assertEqual(loaded.tags, tags)
        self.assertEqual(loaded.states, (adv.CopyState.GOOD,) * 2)


class MetaDiskTests(SynchronousTestCase):
    """C{fleetd-agent meta write|read --disk} on GPT image files."""

    def setUp(self) -> None:
        self.image = makeImage(self)
        self.offset, self.length = metaRange(self.image)

    def meta(self, *argv: str, disk: str | None = None) -> tuple[int, str, str]:
        action, *rest = argv
        return runAgent("meta", action, "--disk", disk or str(self.image), *rest)

    def ok(self, *argv: str, disk: str | None = None) -> tuple[str, str]:
        code, out, err = self.meta(*argv, disk=disk)
        self.assertEqual(code, 0, err)
        return out, err

    def keys(self, disk: str | None = None) -> dict[str, str]:
        out, err = self.ok("read", "--json", disk=disk)
        self.assertEqual(err, "")
        doc = json.loads(out)
        self.assertEqual(set(doc), {"keys"})
        keys: dict[str, str] = doc["keys"]
        return keys

    def refused(self, *argv: str, disk: str | None = None) -> str:
        code, out, err = self.meta(*argv, disk=disk)
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertNotIn("Traceback", err)
        return err

    def area(self) -> bytes:
        with self.image.open("rb") as f:
            f.seek(self.offset)
            return f.read(adv.SIZE)

    def imageDigest(self) -> str:
        return sha256(self.image.read_bytes())

    def test_newPartition_roundTrip(self) -> None:
        """A META never written: the code lands as 0x0b in both copies,
        byte for byte Talos's Bytes() of that one key."""
        self.assertEqual(self.keys(), {})
        out, _ = self.ok("write", "0xb", CODE.decode())
        self.assertEqual(
            out, f"META 0x0b written on {self.image} (both copies, read back)\n"
        )
        self.assertEqual(self.keys(), {"0x0b": CODE.decode()})
        self.assertEqual(sha256(self.area()), CODE_BYTES_SHA256)

    def test_existingKeys_kept(self) -> None:
        """Writing one key keeps every other; writing it again replaces it."""
        network = "addresses:\n  - 10.0.0.2/24\n"
        self.ok("write", "0x0a", network)
        self.ok("write", "0x0b", "first")
        self.ok("write", "11", CODE.decode())
        self.assertEqual(self.keys(), {"0x0a": network, "0x0b": CODE.decode()})
        out, _ = self.ok("read")
        self.assertEqual(out, f"0x0a {network!r}\n0x0b {CODE.decode()}\n")

    def test_writeJSON_namesKeyAndKeys(self) -> None:
        """meta write --json: the disk, the key written and all keys."""
        out, _ = self.ok("write", "--json", "0x0b", "c1")
        self.assertEqual(
            json.loads(out),
            {"disk": str(self.image), "written": "0x0b", "keys": {"0x0b": "c1"}},
        )

    def test_restOfDisk_untouched(self) -> None:
        """Only META's first 512 KiB change: its tail (Talos's legacy
        syslinux ADV) and every other partition are left as they were."""
        pattern = bytes(range(256)) * (self.length // 256)
        with self.image.open("r+b") as f:
            f.seek(self.offset)
            f.write(pattern)
            f.seek(0)
            before = f.read()
        # Pattern bytes are no META: zero the two copies first, as a fresh one.
        with self.image.open("r+b") as f:
            f.seek(self.offset)
            f.write(bytes(adv.SIZE))
        self.ok("write", "0x0b", CODE.decode())
        after = self.image.read_bytes()
        end = self.offset + adv.SIZE
        self.assertEqual(after[: self.offset], before[: self.offset])
        self.assertEqual(after[end:], before[end:])

    def test_full_refusedNothingWritten(self) -> None:
        """A value that does not fit: one line, exit 1, the disk unchanged."""
        self.ok("write", "0x0a", "network")
        before = self.imageDigest()
        err = self.refused("write", "0x0b", "x" * (adv.DATA_LENGTH - 8))
        self.assertIn("META is full", err)
        self.assertIn("nothing written", err)
        self.assertEqual(self.imageDigest(), before)

    def test_full_exactFit_written(self) -> None:
        """What exactly fills the data area is written and read back."""
        value = "x" * (adv.DATA_LENGTH - 8 - (8 + len("network")))
        self.ok("write", "0x0a", "network")
        self.ok("write", "0x0b", value)
        self.assertEqual(self.keys()["0x0b"], value)

    def corrupt(self, copy: int, offset: int = 100) -> None:
        """Flip one byte inside a copy's data area (copy 1 or 2)."""
        with self.image.open("r+b") as f:
            where = self.offset + (copy - 1) * adv.LENGTH + offset
            f.seek(where)
            byte = f.read(1)
            f.seek(where)
            f.write(bytes([byte[0] ^ 0xFF]))

    def test_corruptCopy_readFromGoodOne(self) -> None:
        """A bad first copy: read reports the second copy's keys and says,
        in one stderr line, that copy 1 is bad."""
        self.ok("write", "0x0b", CODE.decode())
        self.corrupt(1)
        out, err = self.ok("read", "--json")
        self.assertEqual(json.loads(out), {"keys": {"0x0b": CODE.decode()}})
        self.assertEqual(
            err,
            f"fleetd-agent: meta read: copy 1 of META on {self.image} is bad"
            " (checksum mismatch); read from copy 2\n",
        )

    def test_corruptCopy_repairedOnWrite(self) -> None:
        """A bad second copy is rewritten from the first on the next write;
        both copies are then good and equal."""
        self.ok("write", "0x0a", "network")
        self.corrupt(2, offset=adv.LENGTH - 2)  # its trailing magic
        _, err = self.ok("write", "0x0b", CODE.decode())
        self.assertIn("copy 2 of META", err)
        self.assertIn("bad magic at the end", err)
        loaded = adv.load(self.area())
        self.assertEqual(loaded.states, (adv.CopyState.GOOD,) * 2)
        self.assertEqual(self.keys(), {"0x0a": "network", "0x0b": CODE.decode()})

    def test_bothCopiesCorrupt_refusedNothingWritten(self) -> None:
        """No good copy in a META that was written: refused, untouched."""
        self.ok("write", "0x0b", CODE.decode())
        self.corrupt(1)
        self.corrupt(2)
        before = self.imageDigest()
        err = self.refused("write", "0x0b", "other")
        self.assertIn("no good copy of META", err)
        self.assertEqual(self.imageDigest(), before)
        self.assertIn("no good copy of META", self.refused("read"))

    def test_noMetaPartition_oneLine(self) -> None:
        """A disk without META: one line naming it."""
        image = makeImage(self, layout=(("STATE", "4MiB"),))
        err = self.refused("read", disk=str(image))
        self.assertEqual(
            err, f"fleetd-agent: meta read: {image}: no partition named META\n"
        )

    def test_metaTooSmall_refused(self) -> None:
        """A META smaller than two copies is not Talos's."""
        image = makeImage(self, layout=(("META", "256KiB"),))
        self.assertIn("fewer than META's 524288", self.refused("read", disk=str(image)))

    def test_notADisk_refused(self) -> None:
        """Missing paths and character devices: one line each."""
        self.assertIn("no such disk", self.refused("read", disk="/nonexistent/x"))
        self.assertIn(
            "neither a block device nor a disk image file",
            self.refused("write", "0x0b", "c", disk="/dev/null"),
        )

    def test_badKey_refused(self) -> None:
        """Keys outside 0x01-0xff are refused before the disk is opened."""
        self.assertIn("META keys are 0x01-0xff", self.refused("write", "0x100", "v"))
        self.assertIn("not a META key", self.refused("write", "code", "v"))

    def test_noServerNeeded_butOthersStillAskForIt(self) -> None:
        """meta needs no --server; plan without one is still a usage error."""
        self.ok("read")
        code, _, err = runAgent("plan")
        self.assertEqual(code, 1)
        self.assertEqual(
            err, "fleetd-agent: the following arguments are required: --server\n"
        )

    def test_loopDevice_writeAndReadBack(self) -> None:
        """Through a loop device over the image: written, read back, and
        the image file then holds Talos's bytes."""
        device = loopDevice(self, self.image)
        self.ok("write", "0x0b", CODE.decode(), disk=device)
        self.assertEqual(self.keys(disk=device), {"0x0b": CODE.decode()})
        self.assertEqual(sha256(self.area()), CODE_BYTES_SHA256)

    def test_loopDevice4096_writeAndReadBack(self) -> None:
        """A 4096-byte-sector disk: META found and written the same way."""
        image = Path(self.mktemp())
        with image.open("wb") as f:
            f.truncate(64 * MiB)
        device = loopDevice(self, image, 4096)
        partition(device)
        self.ok("write", "0x0b", CODE.decode(), disk=device)
        self.assertEqual(self.keys(disk=device), {"0x0b": CODE.decode()})

    def test_mountedDisk_refusedInUse(self) -> None:
        """A disk the kernel holds (a mounted file system) is not written:
        the exclusive open fails, one line."""
        image = Path(self.mktemp())
        with image.open("wb") as f:
            f.truncate(64 * MiB)
        device = loopDevice(self, image)
        mountpoint = Path(self.mktemp())
        mountpoint.mkdir()
        made = subprocess.run(["mkfs.ext4", "-q", device], capture_output=True)
        mounted = subprocess.run(
            ["mount", device, str(mountpoint)], capture_output=True
        )
        if made.returncode or mounted.returncode:
            raise SkipTest(f"cannot mount a loop device here: {mounted.stderr!r}")
        self.addCleanup(subprocess.run, ["umount", str(mountpoint)], check=False)
        err = self.refused("write", "0x0b", "c", disk=device)
        self.assertEqual(
            err, f"fleetd-agent: meta write: {device}: in use (mounted or held open)\n"
        )
