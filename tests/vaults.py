"""
L{FaultyVault}: a vault whose writes can be made to fail, for failure-path
tests (a full tmpfs, an I/O error) at any level, daemon included.

Wrap the vault a daemon or registry would use, then switch failures on::

    prepared = prepare(settings)
    vault = FaultyVault(prepared.vault)
    service = FleetdService(dataclasses.replace(prepared, vault=vault), reactor)
    vault.failWrites()                      # every put: ENOSPC
    vault.failWrites(names=lambda n: n.endswith(".served"))  # served marks only
    vault.failDeletes(errno.EIO)
    vault.heal()

A failing put or delete raises L{VaultWriteError} exactly as
L{DirectoryVault} does for the same errno (same type, C{errno} attribute
and message) and leaves the wrapped vault untouched, as a real failed write
leaves the directory and memory as they were.

L{fakeMountInfo} writes a mountinfo file for the vault's filesystem check.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from fleetd.vault import IVault, VaultWriteError, checkName


def _every(name: str) -> bool:
    return True


class FaultyVault:
    """
    An L{IClosableVault} forwarding to C{inner} until told to fail.

    @ivar failures: how many puts and deletes were refused so far.
    @ivar refused: the names of those refused, in order.
    """

    def __init__(self, inner: IVault) -> None:
        self.inner = inner
        self.failures = 0
        self.refused: list[str] = []
        self._putFault: tuple[int, Callable[[str], bool]] | None = None
        self._deleteFault: tuple[int, Callable[[str], bool]] | None = None

    def failWrites(
        self, number: int = errno.ENOSPC, names: Callable[[str], bool] = _every
    ) -> None:
        """From now on, puts of C{names} fail with C{number} (a full tmpfs)."""
        self._putFault = (number, names)

    def failDeletes(
        self, number: int = errno.EIO, names: Callable[[str], bool] = _every
    ) -> None:
        """From now on, deletes of C{names} fail with C{number}."""
        self._deleteFault = (number, names)

    def heal(self) -> None:
        """Let every put and delete through again."""
        self._putFault = self._deleteFault = None

    def _check(
        self, fault: tuple[int, Callable[[str], bool]] | None, action: str, name: str
    ) -> None:
        checkName(name)  # a bad name is a bad name, fault or not
        if fault is not None and fault[1](name):
            self.failures += 1
            self.refused.append(name)
            raise VaultWriteError.injected(action, name, fault[0])

    def put(self, name: str, data: bytes) -> None:
        self._check(self._putFault, "write", name)
        self.inner.put(name, data)

    def get(self, name: str) -> bytes | None:
        return self.inner.get(name)

    def delete(self, name: str) -> None:
        self._check(self._deleteFault, "delete", name)
        self.inner.delete(name)

    def names(self) -> list[str]:
        return self.inner.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, name: object) -> bool:
        return name in self.inner

    def close(self) -> None:
        """Close the wrapped vault, when it has something to close."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


# A configuration as the vault tests write it, and the refusal log format.
SECRET = b"machine:\n  token: do-not-leak\n"
REFUSED = "vault.refused {name} {kind} {owner} {removed}"


def _escape(path: str) -> str:
    """Escape C{path} the way the kernel writes it in mountinfo."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def fakeMountInfo(testCase: SynchronousTestCase, mounts: dict[str, str]) -> Path:
    """Write a mountinfo file with C{/} on ext4 plus C{mounts}."""
    lines = ["22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"]
    for index, (mountPoint, fsType) in enumerate(mounts.items()):
        lines.append(
            f"{40 + index} 22 0:{35 + index} / {_escape(mountPoint)} "
            f"rw,nosuid,nodev shared:5 - {fsType} {fsType} rw,mode=700"
        )
    path = Path(testCase.mktemp())
    path.write_text("\n".join(lines) + "\n")
    return path
