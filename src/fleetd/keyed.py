"""
HMAC-SHA256 under a fixed key, for the hot paths (journal digests, code
digests): the keyed inner and outer hash states (RFC 2104) are computed
once, so each message costs two hash copies instead of a key set-up.
"""

from __future__ import annotations

import functools
import hashlib


class KeyedHMAC:
    """
    HMAC-SHA256 under one key (RFC 2104), with the keyed inner and outer
    hash states computed once: the same digests as C{hmac.digest}, without
    setting the key up again for every entry.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) > 64:  # SHA-256's block size
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def digest(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


@functools.lru_cache(maxsize=16)
def keyedHMAC(key: bytes) -> KeyedHMAC:
    """The L{KeyedHMAC} of C{key}, built once (fleetd has a handful of keys)."""
    return KeyedHMAC(key)
