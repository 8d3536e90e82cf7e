"""
Talos's META key/value format (its "Talos ADV"), as bytes: no I/O here.

The format is Talos's C{adv/talos} package: C{siderolabs/go-adv}
C{adv/talos/talos.go} (v1.0.0, which Talos's C{go.mod} requires), until
Talos commit C{a6edcf6f3} ("chore: move out adv library") the file
C{internal/pkg/meta/internal/adv/talos/talos.go} of C{siderolabs/talos},
used by C{internal/pkg/meta/meta.go}. Layout of one copy, big-endian::

    0x00000   4 bytes      magic1 0x5a4b3c2d
    0x00004   4 bytes      tag      \\
    0x00008   4 bytes      size      > repeated; a tag of 0 (or fewer
    0x0000c   size bytes   value    /  than 8 bytes left) ends the list
    ...       zeros
    -0x00024  32 bytes     SHA-256 of the whole copy with these 32 bytes zero
    -0x00004  4 bytes      magic2 0xa5b4c3d2

A copy is L{LENGTH} (256 KiB) long and the META partition starts with two
identical copies (C{Bytes()} appends the copy to itself); Talos reads the
first copy and falls back to the second only when the first does not
parse (C{NewADV}). The rest of the 1 MiB partition is not this format
(Talos keeps a legacy syslinux ADV in its last 1 KiB) and is left alone.

Tags are a byte wide (Talos's C{Tag uint8}; the format has room for 32
bits). Talos serializes tags in Go map order, that is in no fixed order;
this module writes them in ascending order, which Talos reads the same.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from enum import Enum

# go-adv adv/talos/talos.go lines 23-27 (Talos's copy: lines 23-27 too).
LENGTH = 256 * 1024
DATA_LENGTH = LENGTH - 40
SIZE = 2 * LENGTH
# go-adv adv/talos/talos.go lines 30-33.
MAGIC1 = 0x5A4B3C2D
MAGIC2 = 0xA5B4C3D2
# go-adv adv/internal/constants/constants.go: End = iota (0) is the no-op tag
# that ends the list.
END = 0
_CHECKSUM = slice(LENGTH - 36, LENGTH - 4)
_HEADER = struct.Struct(">II")


class ADVError(Exception):
    """One line: why bytes are not a META copy, or why keys do not fit."""


class CopyState(Enum):
    """What one of the two copies on disk holds."""

    GOOD = "good"
    BLANK = "blank"  # all zeros: a partition Talos never wrote
    CORRUPT = "corrupt"


def parseCopy(buf: bytes) -> dict[int, bytes]:
    """
    The tags of one copy, as Talos's C{Unmarshal} reads them: both magics,
    the checksum, then tag/size/value records until a tag 0 or fewer than
    8 bytes are left.

    @raise ADVError: naming the first thing that is wrong.
    """
    if len(buf) != LENGTH:
        raise ADVError(f"a copy is {LENGTH} bytes, not {len(buf)}")
    if int.from_bytes(buf[:4], "big") != MAGIC1:
        raise ADVError("bad magic at the start")
    if int.from_bytes(buf[-4:], "big") != MAGIC2:
        raise ADVError("bad magic at the end")
    zeroed = bytearray(buf)
    zeroed[_CHECKSUM] = bytes(32)
    if hashlib.sha256(zeroed).digest() != buf[_CHECKSUM]:
        raise ADVError("checksum mismatch")
    tags: dict[int, bytes] = {}
    data = memoryview(buf)[4 : LENGTH - 36]
    while len(data) >= 8:
        tag, size = _HEADER.unpack_from(data)
        if tag == END:
            break
        if len(data) < size + 8:
            raise ADVError(f"tag {tag:#04x}: value runs past the end")
        # Talos keeps the last record of a tag seen twice; so does this.
        tags[tag & 0xFF] = bytes(data[8 : 8 + size])
        data = data[8 + size :]
    return tags


def used(tags: dict[int, bytes]) -> int:
    """Bytes the records of C{tags} take in a copy's data area."""
    return sum(8 + len(value) for value in tags.values())


def serializeCopy(tags: dict[int, bytes]) -> bytes:
    """
    One copy holding C{tags}, as Talos's C{Marshal} builds it (tags in
    ascending order).

    @raise ADVError: when the records do not fit in L{DATA_LENGTH} bytes.
    """
    for tag in tags:
        if not END < tag <= 0xFF:
            raise ADVError(f"key {tag:#x}: keys are 0x01-0xff")
    need = used(tags)
    if need > DATA_LENGTH:
        raise ADVError(
            f"META is full: the keys need {need} bytes, it holds {DATA_LENGTH}"
        )
    buf = bytearray(LENGTH)
    buf[:4] = MAGIC1.to_bytes(4, "big")
    buf[-4:] = MAGIC2.to_bytes(4, "big")
    offset = 4
    for tag in sorted(tags):
        value = tags[tag]
        _HEADER.pack_into(buf, offset, tag, len(value))
        buf[offset + 8 : offset + 8 + len(value)] = value
        offset += 8 + len(value)
    buf[_CHECKSUM] = hashlib.sha256(buf).digest()
    return bytes(buf)


def serialize(tags: dict[int, bytes]) -> bytes:
    """Both copies (Talos's C{Bytes()}): L{SIZE} bytes."""
    one = serializeCopy(tags)
    return one + one


@dataclass(frozen=True)
class Loaded:
    """
    The META area as found: the tags Talos would use and each copy's state.

    @ivar tags: from the first good copy (C{None} when neither is good).
    @ivar states: the first and the second copy's L{CopyState}.
    @ivar problems: per copy, why it is not good (C{None} when it is).
    @ivar differ: both copies are good but hold different tags.
    """

    tags: dict[int, bytes] | None
    states: tuple[CopyState, CopyState]
    problems: tuple[str | None, str | None]
    differ: bool

    @property
    def fresh(self) -> bool:
        """Neither copy was ever written: a new, zeroed META partition."""
        return self.states == (CopyState.BLANK, CopyState.BLANK)


def load(area: bytes) -> Loaded:
    """Read both copies of the first L{SIZE} bytes of a META partition."""
    if len(area) < SIZE:
        raise ADVError(f"META holds {len(area)} bytes, fewer than {SIZE}")
    states: list[CopyState] = []
    problems: list[str | None] = []
    found: list[dict[int, bytes] | None] = []
    for index in (0, 1):
        buf = area[index * LENGTH : (index + 1) * LENGTH]
        try:
            found.append(parseCopy(buf))
        except ADVError as e:
            found.append(None)
            blank = not any(buf)
            states.append(CopyState.BLANK if blank else CopyState.CORRUPT)
            problems.append("never written" if blank else str(e))
        else:
            states.append(CopyState.GOOD)
            problems.append(None)
    first, second = found
    return Loaded(
        tags=first if first is not None else second,
        states=(states[0], states[1]),
        problems=(problems[0], problems[1]),
        differ=first is not None and second is not None and first != second,
    )


def parseKey(text: str) -> int:
    """
    A META key as C{talosctl meta write} takes it (Go's
    C{strconv.ParseUint(key, 0, 8)}: C{0x0b}, C{0xb}, C{11}); 0 is refused,
    being the tag that ends the list.

    @raise ADVError: not a key.
    """
    try:
        key = int(text.strip(), 0)
    except ValueError:
        raise ADVError(f"{text!r} is not a META key (e.g. 0x0b)") from None
    if not END < key <= 0xFF:
        raise ADVError(f"META keys are 0x01-0xff, not {text!r}")
    return key


def keyName(tag: int) -> str:
    """C{0x0b}: how keys are shown."""
    return f"0x{tag:02x}"
