"""
Open the vault directory once, safely, and keep its descriptor [V1].

The path is walked from C{/} one component at a time, each opened with
C{O_NOFOLLOW} relative to the descriptor of its parent, so no symbolic link
is ever followed and nothing can be swapped between a check and its use.
What is opened is checked with C{fstat}:

  - every directory on the way is owned by root or by fleetd's uid;
  - every ancestor is writable by nobody else, unless it is sticky (C{/tmp},
    C{/dev/shm}): there others cannot rename or remove what they do not
    own, and the next component must be root's or fleetd's anyway;
  - the vault directory itself is owned by fleetd's uid and ends up mode
    0700. A wider mode is tightened when nobody else could have written
    into it (we created it, or it was only readable by others); a
    directory that others could write into may hold planted files and is
    refused.

Missing components are created with mode 0700. Everything is Linux
(C{O_PATH}, C{/proc/self/mountinfo}), like the daemon.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from twisted.logger import Logger

from fleetd.vault.errors import VaultError

DIRECTORY_MODE = 0o700

# O_PATH needs only search permission on the ancestors.
_ANCESTOR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_VAULT = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

log = Logger()


@dataclass(frozen=True)
class OpenedDirectory:
    """A directory descriptor and the canonical path it was opened by."""

    fd: int
    path: str


def openVaultDirectory(path: str | os.PathLike[str], uid: int) -> OpenedDirectory:
    """
    Walk to C{path} without following symbolic links, creating what is
    missing, and return a read descriptor of the vault directory.

    @param uid: fleetd's effective uid; the only owner besides root that
        the path may have.
    @raise VaultError: one line naming the component that is not safe.
    """
    # Lexical normalisation is exact here: no component may be a link.
    absolute = os.path.abspath(os.fspath(path))
    parts = [part for part in absolute.split("/") if part]
    if not parts:
        raise VaultError("vault path / cannot be the vault directory")
    fd = os.open("/", _ANCESTOR)
    current, created = "/", False
    try:
        for index, name in enumerate(parts):
            _checkAncestor(current, os.fstat(fd), uid)
            child = os.path.join(current, name)
            last = index == len(parts) - 1
            childFd, created = _openChild(
                fd, name, child, _VAULT if last else _ANCESTOR
            )
            os.close(fd)
            fd, current = childFd, child
        _checkVault(fd, current, uid, created)
    except BaseException:
        os.close(fd)
        raise
    return OpenedDirectory(fd, current)


def _openChild(parent: int, name: str, shown: str, flags: int) -> tuple[int, bool]:
    """Open (creating if missing) C{name} under C{parent}; never a link."""
    created = False
    try:
        try:
            return os.open(name, flags, dir_fd=parent), created
        except FileNotFoundError:
            try:
                os.mkdir(name, DIRECTORY_MODE, dir_fd=parent)
                created = True
                log.info("vault.created {path}", path=shown)
            except FileExistsError:
                pass  # someone else's, or ours from a racing start: checked below
            return os.open(name, flags, dir_fd=parent), created
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            raise VaultError(_notADirectory(parent, name, shown)) from e
        raise VaultError(f"cannot open vault path {shown}: {e.strerror}") from e


def _notADirectory(parent: int, name: str, shown: str) -> str:
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except OSError:
        mode = 0
    if stat.S_ISLNK(mode):
        return (
            f"vault path {shown} is a symbolic link; configure the real path "
            "(no link is followed on the way to the vault)"
        )
    return f"vault path {shown} is not a directory"


def _checkAncestor(shown: str, st: os.stat_result, uid: int) -> None:
    """Refuse an ancestor that someone other than root or fleetd controls."""
    if st.st_uid not in (0, uid):
        raise VaultError(
            f"vault path {shown} is owned by uid {st.st_uid}, not root or "
            f"fleetd's uid {uid}"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise VaultError(
            f"vault path {shown} is writable by group or others "
            f"(mode {mode:04o}) and not sticky"
        )


def _checkVault(fd: int, shown: str, uid: int, created: bool) -> None:
    """The vault directory is fleetd's and ends up mode 0700."""
    st = os.fstat(fd)
    if st.st_uid != uid:
        raise VaultError(
            f"vault directory {shown} is owned by uid {st.st_uid}, "
            f"not fleetd's uid {uid}"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode == DIRECTORY_MODE:
        return
    if mode & 0o022 and not created:
        raise VaultError(
            f"vault directory {shown} is writable by group or others "
            f"(mode {mode:04o}) and may hold planted files; remove it"
        )
    os.fchmod(fd, DIRECTORY_MODE)
    if not created:
        log.warn(
            "vault.fixed_directory_mode {path} {mode}", path=shown, mode=f"{mode:04o}"
        )
