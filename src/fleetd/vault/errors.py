"""The vault's errors: one line each, naming entries and paths, never contents."""

from __future__ import annotations

import errno
import os


class VaultError(Exception):
    """A vault name, directory or write is unacceptable; one-line message."""


class VaultWriteError(VaultError):
    """
    A put or delete did not reach the vault directory: the entry is as it
    was and no temporary file is left behind.

    @ivar name: the entry concerned.
    @ivar errno: the operating system's error number (C{ENOSPC} for a full
        tmpfs), so callers can tell a full vault from other failures.
    """

    def __init__(self, action: str, name: str, error: OSError) -> None:
        self.name = name
        self.errno = error.errno
        reason = error.strerror or type(error).__name__
        if error.errno == errno.ENOSPC:
            reason = f"the vault's filesystem is full ({reason})"
        super().__init__(f"cannot {action} vault entry {name}: {reason}")

    @classmethod
    def injected(cls, action: str, name: str, number: int) -> VaultWriteError:
        """The error a real write failing with C{number} would raise."""
        return cls(action, name, OSError(number, os.strerror(number)))
