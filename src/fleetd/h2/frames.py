"""
The frames a client sends, read off its bytes before h2 parses them
(issue 26; design.md, Listeners).

L{FrameMeter} reads only the 9-byte frame headers. It counts every frame,
so the connection's frame budget (L{fleetd.h2.guard.ConnectionGuard.frames})
covers PRIORITY, WINDOW_UPDATE, empty DATA, unknown types, SETTINGS, PING
and CONTINUATION alike, as nginx and the Go and Rust HTTP/2 servers count
them; it bounds the bytes of a header block not yet ended (HEADERS and its
CONTINUATIONs before END_HEADERS, the CVE-2024-27316 class), which h2
would hold up to 64 frames of 16 KiB; and it cuts a read into slices of at
most L{SLICE_FRAMES} frames, so that a connection found past a budget
while one slice is parsed costs no more than that slice.
"""

from __future__ import annotations

PREFACE_SIZE = 24  # b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_SIZE = 9
HEADERS = 0x1
CONTINUATION = 0x9
END_HEADERS = 0x4

# The most frames of one read given to h2 before the connection is asked
# again whether it is closing (8 streams of a rapid-reset flood).
SLICE_FRAMES = 16


class FrameMeter:
    """
    Follows one client's frame boundaries (see the module docstring).

    @ivar inBlock: a header block is open (no END_HEADERS yet).
    @ivar blockBytes: the open header block's bytes so far.
    @ivar blocks: how many header blocks were begun (which one is open).
    """

    __slots__ = ("_head", "_left", "_maxBlock", "blockBytes", "blocks", "inBlock")

    def __init__(self, maxHeaderBlock: int, preface: int = PREFACE_SIZE) -> None:
        self._maxBlock = maxHeaderBlock
        self._left = preface  # bytes before the next frame header
        self._head = b""  # the start of a frame header split across reads
        self.inBlock = False
        self.blockBytes = 0
        self.blocks = 0

    def read(self, data: bytes) -> tuple[list[int], int, bool]:
        """
        Follow C{data}, the next bytes of the connection.

        @return: the offsets at which to cut C{data} into slices of at most
            L{SLICE_FRAMES} frame starts, how many frames started in it,
            and whether the open header block is now past its bound.
        """
        cuts: list[int] = []
        frames = 0
        pos = min(self._left, len(data))
        self._left -= pos
        head = self._head
        size = len(data)
        while pos < size:
            start = pos
            if head or size - pos < HEADER_SIZE:
                take = min(HEADER_SIZE - len(head), size - pos)
                head += data[pos : pos + take]
                pos += take
                if len(head) < HEADER_SIZE:
                    break
                header, head = head, b""
            else:
                header = data[pos : pos + HEADER_SIZE]
                pos += HEADER_SIZE
            frames += 1
            if frames % SLICE_FRAMES == 1 and frames > 1 and start:
                cuts.append(start)
            length = int.from_bytes(header[:3], "big")
            if self._header(header[3], header[4], length):
                self._head = b""
                return cuts, frames, True
            skip = min(length, size - pos)
            pos += skip
            self._left = length - skip
        self._head = head
        return cuts, frames, False

    def _header(self, kind: int, flags: int, length: int) -> bool:
        """Follow a header block; whether it is now past its bound."""
        if kind == HEADERS:
            self.inBlock = True
            self.blockBytes = 0
            self.blocks += 1
        elif kind != CONTINUATION or not self.inBlock:
            return False
        self.blockBytes += length
        if flags & END_HEADERS:
            self.inBlock = False
            return False
        return self.blockBytes > self._maxBlock
