"""
One-time codes and their keyed digests.

A code is a bearer credential that Talos reads from META 0x0b and sends in
the C{/config} query; it is shown once to the owner and never stored.
fleetd keeps only HMAC-SHA256(key, code), with a key derived from the
persistent master key, so a copy of the database does not reveal codes.
"""

from __future__ import annotations

import re
import secrets

from fleetd.keyed import keyedHMAC

CODE_BYTES = 24  # 192 bits
_CODE = re.compile(r"^[A-Za-z0-9_-]{16,128}$")


def mintCode() -> str:
    """A new URL-safe one-time code of 192 random bits."""
    return secrets.token_urlsafe(CODE_BYTES)


def codeDigest(key: bytes, code: str) -> str:
    """The keyed digest stored in place of C{code}."""
    return keyedHMAC(key).digest(code.encode("ascii")).hex()


def wellFormedCode(value: str) -> bool:
    """Whether C{value} could be a code fleetd minted (cheap pre-check)."""
    return _CODE.match(value) is not None


def mintRunId() -> str:
    """A run identifier: not secret, unique, safe as a vault name."""
    return "r-" + secrets.token_hex(8)
