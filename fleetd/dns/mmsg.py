"""
Batched UDP I/O for the DNS responder: C{recvmmsg}/C{sendmmsg} through
ctypes (Linux only) [A5].

Python's C{socket} module has neither call, and no maintained library on
PyPI offers them. One C{recvmmsg} fills up to L{BATCH} preallocated
buffers and one C{sendmmsg} sends the replies of a batch, so a query costs
a fraction of two system calls instead of two. L{available} says once, at
import, whether libc has both; L{fleetd.dns.udp.listenUDP} falls back to
C{recvfrom}/C{sendto} when it does not.

Everything is allocated once per port (L{Batch}): the message headers,
iovecs, address slots and buffers; a receive fills them and the caller
reads lengths, flags and addresses with C{struct} from bytearrays the
ctypes structures live in, which is cheaper than ctypes attribute access.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

BATCH = 64
"""The most datagrams one call receives or sends."""

REPLY_SLOT = 4096
"""Bytes kept per reply in the send buffer; larger replies go by C{sendto}."""

MSG_DONTWAIT = 0x40
MSG_TRUNC = 0x20


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.c_void_p),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint)]


_HDR = ctypes.sizeof(_MMsgHdr)
_IOV = ctypes.sizeof(_IOVec)
_NAME = 28  # sizeof(struct sockaddr_in6) >= sizeof(struct sockaddr_in)
_NAMELEN_AT = _MsgHdr.msg_namelen.offset
_FLAGS_AT = _MsgHdr.msg_flags.offset
_LEN_AT = _MMsgHdr.msg_len.offset
_IOVLEN_AT = _IOVec.iov_len.offset
_UINT = struct.Struct("I")
_INT = struct.Struct("i")
_SIZE = struct.Struct("N")
_PTR = struct.Struct("P")
_PORT = struct.Struct("!H")
_SCOPE = struct.Struct("I")


def _load() -> tuple[Any, Any] | None:
    """libc's C{recvmmsg} and C{sendmmsg}, or C{None} when there are none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        recv, send = libc.recvmmsg, libc.sendmmsg
    except (OSError, AttributeError):
        return None
    recv.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    recv.restype = ctypes.c_int
    send.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    send.restype = ctypes.c_int
    return recv, send


_CALLS = _load()


def available() -> bool:
    """Whether this platform's libc has C{recvmmsg} and C{sendmmsg}."""
    return _CALLS is not None


class _Arrays:
    """C{count} message headers with one iovec and one address slot each."""

    def __init__(self, count: int, slot: int) -> None:
        self.headers = bytearray(_HDR * count)
        self.iovecs = bytearray(_IOV * count)
        self.names = bytearray(_NAME * count)
        self.data = bytearray(slot * count)
        hdrs = (_MMsgHdr * count).from_buffer(self.headers)
        iovs = (_IOVec * count).from_buffer(self.iovecs)
        names = ctypes.addressof(
            (ctypes.c_char * len(self.names)).from_buffer(self.names)
        )
        data = ctypes.addressof((ctypes.c_char * len(self.data)).from_buffer(self.data))
        self.address = ctypes.addressof(hdrs)
        self.nameAddress = names
        for i in range(count):
            iovs[i].iov_base = data + i * slot
            iovs[i].iov_len = slot
            hdr = hdrs[i].msg_hdr
            hdr.msg_name = names + i * _NAME
            hdr.msg_namelen = _NAME
            hdr.msg_iov = ctypes.addressof(iovs[i])
            hdr.msg_iovlen = 1


class Batch:
    """
    Receive and send datagrams in batches on one socket's descriptor.

    @param fd: the socket's file descriptor (non-blocking or not: every call
        passes C{MSG_DONTWAIT}).
    @param family: C{AF_INET} or C{AF_INET6}; addresses are reported as
        C{socket.recvfrom} reports them, trimmed to C{(host, port)}.
    @param size: the largest datagram kept; longer ones are cut to it, as
        C{recvfrom(size)} cuts them.
    """

    def __init__(self, fd: int, family: int, size: int, count: int = BATCH) -> None:
        assert _CALLS is not None, "recvmmsg/sendmmsg not available"
        self._recv, self._send = _CALLS
        self._fd = fd
        self._v6 = family == socket.AF_INET6
        self._size = size
        self.count = count
        self._in = _Arrays(count, size)
        self._out = _Arrays(count, REPLY_SLOT)
        self._nameLen = 28 if self._v6 else 16
        self._pending = 0
        self._pendingNames: list[int] = []
        self.sendto: Callable[[bytes, Any], object] | None = None
        """Where replies that do not fit a slot, or to other addresses, go."""

    # -- receiving

    def receive(self, vlen: int) -> int:
        """
        Receive up to C{vlen} datagrams without waiting; return how many.

        C{EAGAIN}/C{EWOULDBLOCK} return 0; C{EINTR} is retried; any other
        error raises L{OSError} with its errno.
        """
        headers = self._in.headers
        for i in range(vlen):  # the kernel wrote back the last lengths
            _UINT.pack_into(headers, i * _HDR + _NAMELEN_AT, _NAME)
        while True:
            n: int = self._recv(self._fd, self._in.address, vlen, MSG_DONTWAIT, None)
            if n >= 0:
                return n
            code = ctypes.get_errno()
            if code == errno.EINTR:
                continue
            if code in (errno.EAGAIN, errno.EWOULDBLOCK):
                return 0
            raise OSError(code, "recvmmsg: " + errno.errorcode.get(code, str(code)))

    def datagram(self, i: int) -> bytes:
        """Datagram C{i} of the last receive, cut to C{size} when longer."""
        (length,) = _UINT.unpack_from(self._in.headers, i * _HDR + _LEN_AT)
        start = i * self._size
        return bytes(self._in.data[start : start + min(length, self._size)])

    def truncated(self, i: int) -> bool:
        """Whether datagram C{i} was longer than C{size} (C{MSG_TRUNC})."""
        (flags,) = _INT.unpack_from(self._in.headers, i * _HDR + _FLAGS_AT)
        return bool(flags & MSG_TRUNC)

    def address(self, i: int) -> tuple[str, int]:
        """Datagram C{i}'s source as C{(host, port)}, as C{recvfrom} has it."""
        names = self._in.names
        at = i * _NAME
        (port,) = _PORT.unpack_from(names, at + 2)
        if not self._v6:
            return socket.inet_ntop(socket.AF_INET, names[at + 4 : at + 8]), port
        host = socket.inet_ntop(socket.AF_INET6, names[at + 8 : at + 24])
        (scope,) = _SCOPE.unpack_from(names, at + 24)
        if scope:
            try:
                host += "%" + socket.if_indextoname(scope)
            except OSError:
                host += "%" + str(scope)
        return host, port

    # -- sending

    def queue(self, i: int, wire: bytes) -> bool:
        """
        Queue C{wire} for the source of received datagram C{i}; C{False}
        when it does not fit a slot or the queue is full (send it yourself).
        """
        j = self._pending
        if j >= self.count or len(wire) > REPLY_SLOT:
            return False
        out = self._out
        start = j * REPLY_SLOT
        out.data[start : start + len(wire)] = wire
        _SIZE.pack_into(out.iovecs, j * _IOV + _IOVLEN_AT, len(wire))
        at = j * _HDR
        _PTR.pack_into(out.headers, at, self._in.nameAddress + i * _NAME)
        _UINT.pack_into(out.headers, at + _NAMELEN_AT, self._nameLen)
        self._pending = j + 1
        return True

    @property
    def pending(self) -> int:
        """Replies queued and not yet sent."""
        return self._pending

    def flush(self) -> int:
        """
        Send every queued reply; return how many were dropped.

        C{sendmmsg} stops at the first message that fails after others were
        sent and returns their count: the rest is sent again, and a message
        that fails first is dropped (as a failed C{sendto} is) and the rest
        sent after it. C{EINTR} is retried. Must run before the next
        L{receive}: the replies' addresses are the receive slots'.
        """
        total = self._pending
        self._pending = 0
        sent = dropped = 0
        base = self._out.address
        while sent < total:
            n: int = self._send(
                self._fd, base + sent * _HDR, total - sent, MSG_DONTWAIT
            )
            if n > 0:
                sent += n
                continue
            code = ctypes.get_errno()
            if n < 0 and code == errno.EINTR:
                continue
            sent += 1  # the first message failed: drop it, go on with the rest
            dropped += 1
        return dropped
