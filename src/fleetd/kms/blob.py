"""
The keys and the bytes of fleetd's KMS [E2], with no I/O.

Each node has its own key-encryption key (KEK): 32 random bytes, used
with AES-256-GCM. What fleetd answers to a Seal is a sealed blob:

    version (1 byte, 1) | key id (16 bytes) | nonce (12 bytes) | ciphertext+tag

sealed under the KEK with the header (version and key id) and the node's
uuid as associated data, so a blob opens only with its own key and only
for the uuid it was sealed for; the header tells fleetd which key to
use, never a guess. In the state database a KEK is kept wrapped by the
site's master key (AES-256-GCM too, under a key derived from it for this
purpose), with the key id, the device and the uuid as associated data: a
wrapped key moved to another row does not open.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = 1
KEY_ID_SIZE = 16
NONCE_SIZE = 12
TAG_SIZE = 16
KEY_SIZE = 32
HEADER_SIZE = 1 + KEY_ID_SIZE
# What Talos seals: a random passphrase of this many bytes (kms-client's
# pkg/constants PassphraseSize; docs/decisions.md, issue 30).
PASSPHRASE_SIZE = 32
BLOB_SIZE = HEADER_SIZE + NONCE_SIZE + PASSPHRASE_SIZE + TAG_SIZE
WRAP_PURPOSE = "fleetd kms key wrapping v1"
_WRAP_LABEL = b"fleetd kms kek v1\x00"


class BlobError(ValueError):
    """A sealed blob or a wrapped key does not open; one-line reason."""


@dataclass(frozen=True)
class Header:
    """What a sealed blob says of itself."""

    version: int
    keyId: bytes

    @property
    def keyName(self) -> str:
        """The key id as the database and the journal name it."""
        return self.keyId.hex()


def newKeyId() -> bytes:
    return os.urandom(KEY_ID_SIZE)


def newKey() -> bytes:
    return AESGCM.generate_key(bit_length=8 * KEY_SIZE)


def _associated(header: bytes, uuid: str) -> bytes:
    return header + uuid.encode("ascii")


def seal(kek: bytes, keyId: bytes, uuid: str, data: bytes) -> bytes:
    """C{data} sealed for C{uuid} under C{kek} (whose id is C{keyId})."""
    header = bytes([VERSION]) + keyId
    nonce = os.urandom(NONCE_SIZE)
    sealed = AESGCM(kek).encrypt(nonce, data, _associated(header, uuid))
    return header + nonce + sealed


def header(blob: bytes) -> Header:
    """
    Read a blob's header.

    @raise BlobError: not a blob of this version and size.
    """
    if len(blob) < HEADER_SIZE + NONCE_SIZE + TAG_SIZE:
        raise BlobError(f"a sealed blob is {BLOB_SIZE} bytes, not {len(blob)}")
    if blob[0] != VERSION:
        raise BlobError(f"sealed blob version {blob[0]} is not {VERSION}")
    return Header(blob[0], bytes(blob[1:HEADER_SIZE]))


def unseal(kek: bytes, uuid: str, blob: bytes) -> bytes:
    """
    Open C{blob} for C{uuid} with C{kek}.

    @raise BlobError: it does not open (another key, another uuid, or a
        changed byte).
    """
    header(blob)
    head, nonce = blob[:HEADER_SIZE], blob[HEADER_SIZE : HEADER_SIZE + NONCE_SIZE]
    try:
        return AESGCM(kek).decrypt(
            nonce, blob[HEADER_SIZE + NONCE_SIZE :], _associated(head, uuid)
        )
    except InvalidTag:
        raise BlobError("the sealed blob does not open for this node") from None


def _wrapAssociated(keyId: bytes, device: str, uuid: str) -> bytes:
    return b"%s%s\x00%s\x00%s" % (
        _WRAP_LABEL,
        keyId,
        device.encode("utf-8"),
        uuid.encode("ascii"),
    )


def wrap(wrapping: bytes, keyId: bytes, device: str, uuid: str, kek: bytes) -> bytes:
    """C{kek} wrapped by the master key's C{wrapping} key, for its row."""
    nonce = os.urandom(NONCE_SIZE)
    associated = _wrapAssociated(keyId, device, uuid)
    return nonce + AESGCM(wrapping).encrypt(nonce, kek, associated)


def unwrap(
    wrapping: bytes, keyId: bytes, device: str, uuid: str, wrapped: bytes
) -> bytes:
    """
    The KEK of a row.

    @raise BlobError: the row was not wrapped by this master key, or not
        for this key id, device and uuid.
    """
    associated = _wrapAssociated(keyId, device, uuid)
    try:
        kek = AESGCM(wrapping).decrypt(
            wrapped[:NONCE_SIZE], wrapped[NONCE_SIZE:], associated
        )
    except (InvalidTag, ValueError):
        raise BlobError("the stored key does not open with this master key") from None
    if len(kek) != KEY_SIZE:
        raise BlobError("the stored key is not a 256-bit key")
    return kek
