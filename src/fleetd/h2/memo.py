"""
Remembered HPACK work and header checks, for the proxy's h2 connections.

gRPC calls on one connection repeat the same header blocks: an agent polls
with the same request headers every time, tink-server answers with the
same response headers and trailers. Once every field of such a block is in
the HPACK dynamic table (or the static one), encoding it yields the same
bytes and decoding those bytes yields the same fields, as long as the
table has not changed since. The ``hpack`` package redoes that work every
time, in Python, field by field; here the result is remembered instead.

  - L{MemoEncoder} and L{MemoDecoder} are ``hpack``'s coders over a
    L{CountingTable}, whose generation moves on every change to the
    dynamic table (an insert, an eviction with it, a resize). A block
    whose coding did not change the table is remembered with the table's
    generation, and reused only while the generation is the same, which
    is exactly when ``hpack`` would produce the same result again. Blocks
    that insert fields (a new C{grpc-timeout} value each call, say) are
    never reused: they are coded by ``hpack`` every time, as before.
  - L{validatedHeaders} stands in for ``h2``'s inbound header validation
    (C{h2.utilities.validate_headers}): the same checks, run by ``h2``'s
    own code, once per distinct header list and set of flags; a list that
    failed is never remembered, so it fails again every time.

Each memory is bounded (it is emptied when full), so a peer sending ever
new blocks costs what it costs without it, plus a dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import h2.stream
import h2.utilities
from h2.connection import H2Connection
from hpack import Decoder, Encoder, HeaderTuple
from hpack.table import HeaderTable

MEMORY = 64  # header blocks remembered per coder
VALIDATED = 256  # header lists remembered as valid, per process

Header = tuple[bytes, bytes]


_maxsize = cast(property, vars(HeaderTable)["maxsize"])


class CountingTable(HeaderTable):
    """An HPACK dynamic table that counts its changes (L{generation})."""

    generation = 0

    def add(self, name: bytes, value: bytes) -> None:
        if self.dynamic_entries or self._maxsize > 0:
            self.generation += 1
        # else: an empty table of size 0 stays empty (a peer that turned
        # indexing off this way, as nginx does, changes nothing).
        HeaderTable.add(self, name, value)

    def _resize(self, value: int) -> None:
        if value != self._maxsize:
            self.generation += 1
        assert _maxsize.fset is not None
        _maxsize.fset(self, value)

    maxsize = property(_maxsize.fget, _resize)


class _Memory:
    """Results remembered with the table generation they were made at;
    emptied when full."""

    def __init__(self, table: CountingTable) -> None:
        self._table = table
        self._results: dict[object, tuple[int, Any]] = {}

    def get(self, key: object) -> Any:
        """What C{key} gave at the table's present generation, or None."""
        known = self._results.get(key)
        if known is not None and known[0] == self._table.generation:
            return known[1]
        return None

    def put(self, key: object, generation: int, result: Any) -> None:
        """Remember C{result} if making it left the table at C{generation}."""
        if self._table.generation != generation:
            return  # it changed the table: never the same again
        if len(self._results) >= MEMORY:
            self._results.clear()
        self._results[key] = (generation, result)

    def __len__(self) -> int:
        return len(self._results)


class MemoEncoder(Encoder):
    """``hpack``'s encoder, remembering blocks that left the table as it was."""

    def __init__(self) -> None:
        super().__init__()
        self.header_table: CountingTable = CountingTable()
        self._memory = _Memory(self.header_table)

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        if self.header_table.resized or isinstance(headers, dict):
            # A pending size update is part of the next block, once.
            return super().encode(headers, huffman)
        fields = tuple(headers)
        # The types too: a NeverIndexedHeaderTuple equals its plain twin
        # but is encoded differently (never indexed, for secrets).
        key = (fields, tuple(map(type, fields)), huffman)
        block: bytes | None = self._memory.get(key)
        if block is None:
            generation = self.header_table.generation
            block = super().encode(fields, huffman)
            self._memory.put(key, generation, block)
        return block


class MemoDecoder(Decoder):
    """``hpack``'s decoder, remembering blocks that left the table as it was."""

    def __init__(self, max_header_list_size: int) -> None:
        super().__init__(max_header_list_size)
        self.header_table: CountingTable = CountingTable()
        self._memory = _Memory(self.header_table)

    def decode(self, data: bytes, raw: bool = False) -> list[HeaderTuple]:
        key = (bytes(data), raw, self.max_header_list_size)
        known: tuple[HeaderTuple, ...] | None = self._memory.get(key)
        if known is not None:
            return list(known)
        generation = self.header_table.generation
        fields = list(super().decode(data, raw))
        self._memory.put(key, generation, tuple(fields))
        return fields


def remember(connection: H2Connection) -> None:
    """Give a new C{connection} remembering coders (before its first frame)."""
    encoder = MemoEncoder()
    decoder = MemoDecoder(connection.decoder.max_header_list_size)
    decoder.max_allowed_table_size = connection.decoder.max_allowed_table_size
    connection.encoder = encoder
    connection.decoder = decoder


_validate = h2.utilities.validate_headers
_valid: set[tuple[tuple[Header, ...], object]] = set()


def validatedHeaders(headers: Iterable[Header], flags: Any) -> Iterable[Header]:
    """C{h2.utilities.validate_headers}, once per distinct list and flags.

    The checks only pass fields through or raise, so a list that passed
    once passes again unchanged; it is returned as given (a field's type,
    never-indexed or not, is kept)."""
    fields = tuple(headers)
    key = (fields, flags)
    if key in _valid:
        return fields
    checked = tuple(_validate(fields, flags))  # raises ProtocolError
    if len(_valid) >= VALIDATED:
        _valid.clear()
    _valid.add(key)
    return checked


def _install() -> None:
    """h2's streams look the validator up as a module global."""
    vars(h2.stream)["validate_headers"] = validatedHeaders


_install()
