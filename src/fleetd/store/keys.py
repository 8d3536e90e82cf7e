"""
The persistent master key and the purpose keys derived from it.

The master key (32 random bytes, mode 0600, beside the database) never
leaves this process; each use gets its own key via L{deriveKey} so that,
for example, the journal chain and the digests of issued codes cannot be
confused with one another.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from twisted.logger import Logger

from fleetd.store.db import StoreError

KEY_SIZE = 32
JOURNAL_PURPOSE = "fleetd journal chain v1"
"""L{deriveKey} purpose for the journal's hash chain."""

log = Logger()


def deriveKey(master: bytes, purpose: str) -> bytes:
    """Return HMAC-SHA256(master, purpose): a 32-byte key for one purpose."""
    if len(master) < KEY_SIZE:
        raise ValueError("master key too short")
    return hmac.new(master, purpose.encode("utf-8"), hashlib.sha256).digest()


def loadOrCreateKey(path: Path) -> bytes:
    """
    Return the master key stored at C{path}, creating it atomically first
    if the file does not exist.

    @raise StoreError: the file is not a regular 32-byte file readable by
        its owner only.
    """
    try:
        return _loadKey(path)
    except FileNotFoundError:
        pass
    _createKey(path)
    return _loadKey(path)


def _loadKey(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise StoreError(f"cannot read key file {path}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"key file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise StoreError(
                f"key file {path} has mode {stat.S_IMODE(st.st_mode):04o}; "
                "it must not be accessible to group or others (want 0600)"
            )
        data = os.read(fd, KEY_SIZE + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_SIZE:
        raise StoreError(f"key file {path} must hold exactly {KEY_SIZE} bytes")
    return data


def _createKey(path: Path) -> None:
    """Write a new key to a temp file, then link it into place.

    Linking (unlike renaming) never replaces a key another process created
    meanwhile: in that race the other key wins and ours is discarded.
    """
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".tmp-{path.name}-{secrets.token_hex(8)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(temp, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, secrets.token_bytes(KEY_SIZE))
            os.fsync(fd)
            os.link(temp, path)
        except FileExistsError:
            pass
        else:
            log.info("store.key_created {path}", path=str(path))
        finally:
            os.close(fd)
            os.unlink(temp)
        dirFd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dirFd)
        finally:
            os.close(dirFd)
    except OSError as e:
        raise StoreError(f"cannot create key file {path}: {e.strerror}") from e
