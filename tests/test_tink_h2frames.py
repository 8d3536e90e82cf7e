"""
Every frame a client sends counts against its connection, and a header
block left open is bounded in bytes and time (issue 26 items 2 and 3;
design.md, Listeners): L{FrameMeter} on any split of the bytes, then the
tink listener's reactions, on the server harness.
"""

from __future__ import annotations

import itertools

import hpack
from h2.errors import ErrorCodes
from hypothesis import given
from hypothesis import strategies as st
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from fleetd.h2.frames import PREFACE_SIZE, SLICE_FRAMES, FrameMeter
from fleetd.h2.grpcwire import GRPCStatus
from fleetd.h2.guard import H2Limits
from tests.h2support import (
    CALM,
    PREFACE,
    Harness,
    RecordingHandler,
    calm,
    counted,
    grpcHeaders,
    grpcMessage,
    guarded,
)

DATA, HEADERS, PRIORITY, RST, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes([kind, flags])
        + sid.to_bytes(4, "big")
        + payload
    )


# One of each frame that carries no request bytes, on an open stream 1.
EMPTY = {
    "priority": frame(PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10"),
    "window-update": frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")),
    "stream-window-update": frame(WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big")),
    "empty-data": frame(DATA, 0, 1),
    "unknown": frame(0x20, 0, 0, b"junk"),
}


frames = st.lists(
    st.tuples(
        st.integers(0, 0x21),
        st.integers(0, 255),
        st.binary(max_size=40),
    ),
    max_size=60,
)


class FrameMeterTests(SynchronousTestCase):
    """Frame boundaries read off the bytes, however they are split."""

    @given(frames, st.lists(st.integers(1, 50), max_size=30))
    def test_anySplit_countsEveryFrame_cutsAtBoundaries(
        self, spec: list[tuple[int, int, bytes]], sizes: list[int]
    ) -> None:
        """Each frame is counted once, whatever the reads; every cut falls
        on a frame start and no slice holds more than L{SLICE_FRAMES}
        frame starts."""
        spec = [
            (k if k not in (HEADERS, CONTINUATION) else DATA, f, p) for k, f, p in spec
        ]
        wire = PREFACE + b"".join(frame(k, f, 1, p) for k, f, p in spec)
        starts = set()
        at = PREFACE_SIZE
        for _, _, payload in spec:
            starts.add(at)
            at += 9 + len(payload)
        meter = FrameMeter(16384)
        counted = 0
        offset = 0
        reads = []
        for size in [*sizes, len(wire)]:
            if offset >= len(wire):
                break
            reads.append(wire[offset : offset + size])
            offset += size
        offset = 0
        for read in reads:
            cuts, count, over = meter.read(read)
            self.assertFalse(over)
            counted += count
            bounds = [0, *cuts, len(read)]
            for cut in cuts:
                self.assertIn(offset + cut, starts)
            for lo, hi in itertools.pairwise(bounds):
                inside = [s for s in starts if offset + lo <= s < offset + hi]
                self.assertLessEqual(len(inside), SLICE_FRAMES)
            offset += len(read)
        self.assertEqual(counted, len(spec))

    def test_headerBlock_boundedBeforeEndHeaders(self) -> None:
        """HEADERS and CONTINUATIONs without END_HEADERS past the bound are
        reported at the frame that passes it; END_HEADERS closes the
        block, and the next HEADERS starts a new one."""
        meter = FrameMeter(1000)
        block = frame(HEADERS, 0, 1, b"a" * 400) + frame(CONTINUATION, 0, 1, b"b" * 400)
        self.assertEqual(meter.read(PREFACE + block)[1:], (2, False))
        self.assertTrue(meter.inBlock)
        self.assertEqual(meter.blockBytes, 800)
        self.assertEqual(
            meter.read(frame(CONTINUATION, END_HEADERS, 1, b"c"))[2], False
        )
        self.assertFalse(meter.inBlock)
        meter.read(frame(HEADERS, 0, 3, b"a" * 600))
        self.assertEqual(meter.blocks, 2)
        self.assertTrue(meter.read(frame(CONTINUATION, 0, 3, b"b" * 401))[2])


class FrameBudgetTests(SynchronousTestCase):
    """Every frame counts, whatever its type (issue 26 item 2)."""

    def test_eachKind_pastBudget_calm(self) -> None:
        """PRIORITY, WINDOW_UPDATE (connection and stream), empty DATA and
        unknown frames each spend the frame budget: past it, GOAWAY
        (ENHANCE_YOUR_CALM), counted C{frame-budget}, and the source is
        penalized."""
        for kind, one in EMPTY.items():
            h = guarded(H2Limits(frameBurst=50, frameRate=1.0), RecordingHandler)
            h.call(body=grpcMessage(b"x"), end=False)
            h.pump()
            sent = 0
            with capturedLogs() as logs:
                while not h.transport.disconnecting and sent < 200:
                    h.server.dataReceived(one)
                    sent += 1
            self.assertTrue(h.transport.disconnecting, kind)
            self.assertLess(sent, 50, kind)
            self.assertEqual(counted(h.metrics, "frame-budget"), 1, kind)  # type: ignore[attr-defined]
            [line] = [e for e in logs if e.get("log_format") == CALM]
            self.assertEqual(line["reason"], "frame-budget")
            h.pump()
            self.assertEqual(len(calm(h)), 1, kind)
            h.close()

    def test_budgetRefills(self) -> None:
        """The budget is a rate: frames spread over time are never cut."""
        h = guarded(H2Limits(frameBurst=50, frameRate=10.0), RecordingHandler)
        h.call(body=grpcMessage(b"x"), end=False)
        h.pump()
        for _ in range(20):
            for _ in range(9):
                h.server.dataReceived(EMPTY["priority"])
            h.clock.advance(1.0)
        self.assertFalse(h.transport.disconnecting)
        self.assertEqual(calm(h), [])
        h.close()

    def test_busyHonestConnection_neverCut(self) -> None:
        """Calls answered after whole requests pay for their frames: 2,000
        calls on one connection in the same instant (far past the burst
        of frames) are all answered, and none of them is refused."""
        h = guarded(H2Limits(), RecordingHandler)
        for n in range(2000):
            sid = h.call(body=grpcMessage(b"poll"))
            h.pump()
            h.handlers[-1].responder.trailersOnly(GRPCStatus.NOT_FOUND)
            h.pump()
            if h.transport.disconnecting:
                self.fail(f"cut off after {n} calls")
        self.assertEqual(h.response(sid)[b"grpc-status"], b"5")
        self.assertEqual(calm(h), [])
        h.close()

    def test_largeRequest_withinDefaultBudget(self) -> None:
        """A 4 MiB request (256 DATA frames and the WINDOW_UPDATEs they earn)
        passes the default budget at once."""
        h = guarded(H2Limits(), RecordingHandler, maxMessageBytes=8 << 20)
        payload = b"p" * (4 << 20)
        sid = h.client.get_next_available_stream_id()
        h.client.send_headers(sid, grpcHeaders())
        body = grpcMessage(payload)
        while body and not h.transport.disconnecting:
            window = h.client.local_flow_control_window(sid)
            size = min(window, h.client.max_outbound_frame_size, len(body))
            self.assertGreater(size, 0)
            h.client.send_data(sid, body[:size], end_stream=size == len(body))
            body = body[size:]
            h.pump()
        self.assertEqual(calm(h), [])
        self.assertEqual(h.handlers[-1].received, len(payload) + 5)
        h.handlers[-1].responder.trailersOnly(GRPCStatus.OK)
        h.pump()
        self.assertEqual(h.response(sid)[b"grpc-status"], b"0")
        h.close()

    def test_emptyFrames_notProgress(self) -> None:
        """None of these frames keeps a connection open: with no stream, it
        idles out 30 s after its last request or response bytes. (Empty
        DATA on an open stream: L{tests.test_tink_h2flood}.)"""
        for kind in ("priority", "window-update", "unknown"):
            one = EMPTY[kind]
            h = Harness(RecordingHandler, idleTimeout=30.0)
            for _ in range(3):
                h.clock.advance(9.0)
                h.server.dataReceived(one)
            self.assertFalse(h.transport.disconnecting, kind)
            h.clock.advance(3.1)
            self.assertTrue(h.transport.disconnecting, kind)
            h.close()

    def test_resetStream_notProgress(self) -> None:
        """A stream the client resets moves no bytes: the connection's idle
        timeout still counts from its request."""
        h = Harness(RecordingHandler, idleTimeout=30.0)
        sid = h.call(body=grpcMessage(b"x"), end=False)
        h.pump()
        h.clock.advance(20.0)
        h.client.reset_stream(sid, ErrorCodes.CANCEL)
        h.pump()
        self.assertEqual(h.server.streams, {})
        self.assertEqual(h.server._progressAt, 0.0)
        h.clock.advance(30.0)
        self.assertTrue(h.transport.disconnecting)
        h.close()


class HeaderBlockTests(SynchronousTestCase):
    """A header block left open is bounded (issue 26 item 3; the
    CVE-2024-27316 class)."""

    def test_continuationPastHeaderListSize_calm(self) -> None:
        """CONTINUATIONs past the listener's max header list size without
        END_HEADERS: GOAWAY(ENHANCE_YOUR_CALM) at once (h2 alone would
        hold up to 64 frames, 1 MiB)."""
        h = guarded(H2Limits(), maxHeaderListSize=16384)
        h.server.dataReceived(frame(HEADERS, 0, 1, b"\x00"))
        sent = 0
        while not h.transport.disconnecting and sent < 64:
            h.server.dataReceived(frame(CONTINUATION, 0, 1, b"\x40" * 4000))
            sent += 1
        self.assertTrue(h.transport.disconnecting)
        self.assertEqual(sent, 5)  # 20,001 bytes > 16,384
        self.assertEqual(counted(h.metrics, "header-block"), 1)  # type: ignore[attr-defined]
        h.pump()
        self.assertEqual(len(calm(h)), 1)
        h.close()

    def test_openBlock_deadline(self) -> None:
        """A header block still open after C{headerTimeout} is cut off,
        long before the idle timeout."""
        h = guarded(H2Limits(headerTimeout=5.0), idleTimeout=30.0)
        h.server.dataReceived(frame(HEADERS, 0, 1, b"\x00"))
        h.clock.advance(4.9)
        self.assertFalse(h.transport.disconnecting)
        h.clock.advance(0.2)
        self.assertTrue(h.transport.disconnecting)
        self.assertEqual(counted(h.metrics, "header-timeout"), 1)  # type: ignore[attr-defined]
        h.close()
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_splitHeaders_served(self) -> None:
        """An honest request whose headers come in HEADERS and two
        CONTINUATIONs, within the bound and the deadline, is served, and
        no header deadline outlives it."""
        h = guarded(H2Limits(headerTimeout=5.0), RecordingHandler)
        block = hpack.Encoder().encode(grpcHeaders())
        third = len(block) // 3
        h.server.dataReceived(frame(HEADERS, 0, 1, block[:third]))
        h.clock.advance(2.0)
        h.server.dataReceived(frame(CONTINUATION, 0, 1, block[third : 2 * third]))
        h.clock.advance(2.0)
        h.server.dataReceived(frame(CONTINUATION, END_HEADERS, 1, block[2 * third :]))
        h.server.dataReceived(frame(DATA, END_STREAM, 1, grpcMessage(b"x")))
        h.clock.advance(2.0)
        self.assertFalse(h.transport.disconnecting)
        self.assertEqual(h.handlers[-1].calls[0], ("headers", grpcHeaders()[2][1]))
        self.assertIsNone(h.server._headerCall)
        h.close()
