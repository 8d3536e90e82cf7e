"""
The proxy's remembered HPACK work (L{fleetd.h2.memo}): byte for byte
what ``hpack`` itself produces, in every table state, and header checks
that fail every time they should.
"""

from __future__ import annotations

from h2.exceptions import ProtocolError
from h2.utilities import HeaderValidationFlags
from hpack import Decoder, Encoder, HeaderTuple, NeverIndexedHeaderTuple
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from fleetd.h2 import memo as h2memo
from fleetd.h2.memo import MemoDecoder, MemoEncoder, validatedHeaders

REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"https"),
    (b":path", b"/proto.WorkflowService/GetAction"),
    (b":authority", b"tink.example:42113"),
    (b"te", b"trailers"),
    (b"content-type", b"application/grpc"),
    (b"user-agent", b"grpc-go/1.70.0"),
]

# A small pool, so that lists repeat (and are remembered) and fields are
# inserted, evicted and found again, secrets never indexed.
_fields = st.sampled_from(
    [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"0"),
        (b"grpc-status", b"5"),
        (b"grpc-message", b"no%20workflow"),
        (b"x-big", b"v" * 1500),
        (b"x-big", b"w" * 1500),
        (b"grpc-timeout", b"99u"),
        (b"grpc-timeout", b"98u"),
    ]
)
_field = st.one_of(
    _fields,
    _fields.map(lambda f: HeaderTuple(*f)),
    _fields.map(lambda f: NeverIndexedHeaderTuple(*f)),
)
_lists = st.lists(st.lists(_field, min_size=1, max_size=4), min_size=1, max_size=6)
_blocks = st.lists(st.sampled_from(range(6)), min_size=1, max_size=40)


class EncoderTests(SynchronousTestCase):
    """L{MemoEncoder} writes what C{hpack.Encoder} writes."""

    @settings(max_examples=200, deadline=None)
    @given(_lists, _blocks, st.sampled_from([None, 0, 2048, 4096]))
    def test_sameBytes_everyState(
        self, pool: list[list[tuple[bytes, bytes]]], order: list[int], size: int | None
    ) -> None:
        """Any sequence of header lists (repeats, inserts, evictions,
        never-indexed twins of plain fields, a table resize halfway)
        encodes to the same bytes as hpack's own encoder, and decodes
        back to the lists."""
        memo, plain, decoder = MemoEncoder(), Encoder(), Decoder()
        for n, i in enumerate(order):
            if n == len(order) // 2 and size is not None:
                memo.header_table_size = plain.header_table_size = size
            headers = pool[i % len(pool)]
            block = memo.encode(headers)
            self.assertEqual(block, plain.encode(headers))
            self.assertEqual(
                [tuple(f) for f in decoder.decode(block, raw=True)],
                [tuple(f) for f in headers],
            )

    def test_remembered_whileTableUnchanged(self) -> None:
        """A list whose fields are all in the table is encoded once: the
        second time the same bytes come back without hpack's work; a list
        that inserts a field is never reused."""
        memo = MemoEncoder()
        memo.encode(REQUEST)  # inserts the fields not in the static table
        first = memo.encode(REQUEST)
        self.assertIs(memo.encode(REQUEST), first)
        timed = [*REQUEST, (b"grpc-timeout", b"1u")]
        once = memo.encode(timed)  # inserts grpc-timeout
        self.assertNotEqual(memo.encode(timed), once)  # indexed now

    def test_neverIndexed_notConfused(self) -> None:
        """A never-indexed field equal to a remembered plain one is encoded
        as never-indexed (secrets stay out of every table)."""
        memo, reference = MemoEncoder(), Encoder()
        memo.header_table_size = reference.header_table_size = 0  # no inserts
        plain = [(b"authorization", b"Bearer x")]
        for encoder in (memo, reference):
            encoder.encode(plain)
            encoder.encode(plain)
        secret = [NeverIndexedHeaderTuple(b"authorization", b"Bearer x")]
        block = memo.encode(secret)
        self.assertEqual(block, reference.encode(secret))
        self.assertEqual(block[0] & 0xF0, 0x10)  # literal never indexed

    def test_memoryBounded(self) -> None:
        """A peer producing ever new blocks fills the memory only up to
        its bound."""
        memo = MemoEncoder()
        memo.header_table_size = 0  # nothing is inserted: all remembered
        memo.encode([])
        for n in range(3 * h2memo.MEMORY):
            memo.encode([(b"x-n", b"%d" % n)])
        self.assertLessEqual(len(memo._memory), h2memo.MEMORY)


class DecoderTests(SynchronousTestCase):
    """L{MemoDecoder} reads what C{hpack.Decoder} reads."""

    @settings(max_examples=200, deadline=None)
    @given(_lists, _blocks, st.sampled_from([None, 0, 2048]))
    def test_sameFields_everyState(
        self,
        pool: list[list[tuple[bytes, bytes]]],
        order: list[int],
        size: int | None,
    ) -> None:
        """Blocks from a real encoder (its table resized halfway, to 0
        too) decode to the same fields, of the same types (never-indexed
        kept), as with hpack's own decoder."""
        encoder, memo, plain = Encoder(), MemoDecoder(65536), Decoder(65536)
        for n, i in enumerate(order):
            if n == len(order) // 2 and size is not None:
                encoder.header_table_size = size
            block = encoder.encode(pool[i % len(pool)])
            got, want = memo.decode(block, raw=True), plain.decode(block, raw=True)
            self.assertEqual(got, want)
            self.assertEqual([type(f) for f in got], [type(f) for f in want])

    def test_sizeZeroTable_remembered(self) -> None:
        """A peer that sets its table to size 0 and then sends fields "with
        indexing" (nginx does) changes nothing: its repeated block is
        decoded once."""
        encoder, memo = Encoder(), MemoDecoder(65536)
        encoder.header_table_size = 0
        fields = [(b":status", b"200"), (b"server", b"nginx/1.22.1")]
        memo.decode(encoder.encode(fields), raw=True)  # carries the size update
        block = encoder.encode(fields)
        self.assertEqual(block, encoder.encode(fields))
        memo.decode(block, raw=True)
        results = memo._memory._results
        memo._memory._results = {k: (g, ()) for k, (g, _) in results.items()}
        self.assertEqual(memo.decode(block, raw=True), [])  # from memory

    def test_remembered_andLimitKept(self) -> None:
        """A block that changes nothing is decoded once; the header list
        size limit still refuses it after the limit is lowered."""
        encoder, memo = Encoder(), MemoDecoder(65536)
        memo.decode(encoder.encode(REQUEST), raw=True)
        block = encoder.encode(REQUEST)  # all indexed now
        memo.decode(block, raw=True)
        results = memo._memory._results
        memo._memory._results = {k: (g, ()) for k, (g, _) in results.items()}
        self.assertEqual(memo.decode(block, raw=True), [])  # from memory
        memo.max_header_list_size = 10
        from hpack.exceptions import OversizedHeaderListError

        self.assertRaises(OversizedHeaderListError, memo.decode, block, True)


class ValidationTests(SynchronousTestCase):
    """L{validatedHeaders} is h2's validation, remembered only when passed."""

    flags = HeaderValidationFlags(
        is_client=False,
        is_trailer=False,
        is_response_header=False,
        is_push_promise=False,
    )

    def test_invalid_refusedEveryTime(self) -> None:
        """A list h2 refuses is refused again, not remembered."""
        bad = [*REQUEST, (b"Upper", b"x")]
        for _ in range(2):
            self.assertRaises(
                ProtocolError, lambda: list(validatedHeaders(bad, self.flags))
            )
        noPath = [f for f in REQUEST if f[0] != b":path"]
        for _ in range(2):
            self.assertRaises(
                ProtocolError, lambda: list(validatedHeaders(noPath, self.flags))
            )

    def test_valid_sameFieldsKept(self) -> None:
        """A valid list passes, twice, as the very fields given (a
        never-indexed one stays never-indexed)."""
        fields = [*REQUEST, NeverIndexedHeaderTuple(b"authorization", b"x")]
        for _ in range(2):
            got = list(validatedHeaders(fields, self.flags))
            self.assertEqual(got, fields)
            self.assertIsInstance(got[-1], NeverIndexedHeaderTuple)

    def test_installedInH2(self) -> None:
        """h2's streams validate through it."""
        import h2.stream

        self.assertIs(vars(h2.stream)["validate_headers"], validatedHeaders)
