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
from typing import Any

BATCH = 64
"""The most datagrams one call receives or sends."""

MSG_DONTWAIT = 0x40


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
_NAME = 32  # a slot: sizeof(struct sockaddr_in6) is 28, sockaddr_in 16
_NAMELEN_AT = _MsgHdr.msg_namelen.offset
_LEN_AT = _MMsgHdr.msg_len.offset
_IOVLEN_AT = _IOVec.iov_len.offset
_SIZE = struct.Struct("L")  # size_t is unsigned long on Linux
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


class Batch:
    """
    Receive and send datagrams in batches on one socket's descriptor.

    C{count} message headers, each with one iovec, one address slot and one
    C{size}-byte buffer, serve both directions: a reply to datagram C{i} is
    copied into buffer C{i} and sent from header C{i}, to the address the
    datagram came from, so nothing is encoded per reply.

    @param fd: the socket's file descriptor (every call passes
        C{MSG_DONTWAIT}).
    @param family: C{AF_INET} or C{AF_INET6}; addresses are reported as
        C{socket.recvfrom} reports them, trimmed to C{(host, port)}.
    @param size: the largest datagram kept; longer ones are cut to it, as
        C{recvfrom(size)} cuts them. Also the largest reply queued.
    """

    def __init__(self, fd: int, family: int, size: int, count: int = BATCH) -> None:
        assert _CALLS is not None, "recvmmsg/sendmmsg not available"
        self._recv, self._send = _CALLS
        self._fd = fd
        self._v6 = family == socket.AF_INET6
        self.size = size
        self.count = count
        self._headers = bytearray(_HDR * count)
        self._iovecs = bytearray(_IOV * count)
        self.names = bytearray(_NAME * count)
        self._data = bytearray(size * count)
        hdrs = (_MMsgHdr * count).from_buffer(self._headers)
        iovs = (_IOVec * count).from_buffer(self._iovecs)
        names = (ctypes.c_char * len(self.names)).from_buffer(self.names)
        data = (ctypes.c_char * len(self._data)).from_buffer(self._data)
        for i in range(count):
            iovs[i].iov_base = ctypes.addressof(data) + i * size
            iovs[i].iov_len = size
            hdr = hdrs[i].msg_hdr
            hdr.msg_name = ctypes.addressof(names) + i * _NAME
            hdr.msg_namelen = 28
            hdr.msg_iov = ctypes.addressof(iovs[i])
            hdr.msg_iovlen = 1
        self._address = ctypes.addressof(hdrs)
        self._fullIovecs = bytes(self._iovecs)
        self._dataView = memoryview(self._data)
        self._lengths = memoryview(self._headers).cast("I")[_LEN_AT // 4 :: _HDR // 4]
        self._iovLengths = memoryview(self._iovecs).cast("L")[
            _IOVLEN_AT // _SIZE.size :: _IOV // _SIZE.size
        ]
        # an IPv4 source's first 8 bytes (family, port, address) as one int
        self._keys4 = memoryview(self.names).cast("Q")[:: _NAME // 8]
        self._hosts: dict[int | bytes, tuple[str, int]] = {}
        self.queued: list[int] = []
        """Slots whose replies wait for L{flush}, in order."""

    # -- receiving

    def receive(self, vlen: int) -> int:
        """
        Receive up to C{vlen} datagrams without waiting; return how many.

        C{EAGAIN}/C{EWOULDBLOCK} return 0; C{EINTR} is retried; any other
        error raises L{OSError} with its errno. Replies still queued are
        lost: L{flush} first.
        """
        while True:
            n: int = self._recv(self._fd, self._address, vlen, MSG_DONTWAIT, None)
            if n >= 0:
                return n
            code = ctypes.get_errno()
            if code == errno.EINTR:
                continue
            if code in (errno.EAGAIN, errno.EWOULDBLOCK):
                return 0
            raise OSError(code, "recvmmsg: " + errno.errorcode.get(code, str(code)))

    def datagrams(self, n: int) -> list[tuple[bytes, tuple[str, int]]]:
        """
        The first C{n} datagrams of the last receive with their sources as
        C{recvfrom} has them, C{(host, port)}; datagrams cut to C{size}.
        """
        view, size = self._dataView, self.size
        hosts = self._hosts
        if self._v6:
            names = self.names
            keys: list[Any] = [
                bytes(names[at : at + 28]) for at in range(0, n * _NAME, _NAME)
            ]
        else:
            keys = self._keys4[:n].tolist()
        out = []
        start = 0
        for length, key in zip(self._lengths[:n].tolist(), keys, strict=True):
            addr = hosts.get(key)
            if addr is None:
                addr = self._decode(key, start // size)
            out.append((view[start : start + min(length, size)].tobytes(), addr))
            start += size
        return out

    def _decode(self, key: int | bytes, i: int) -> tuple[str, int]:
        """Slot C{i}'s address, remembered under C{key}."""
        hosts = self._hosts
        if len(hosts) >= 4096:  # a flood of many sources: start again
            hosts.clear()
        at = i * _NAME
        name = bytes(self.names[at : at + 28])
        (port,) = _PORT.unpack_from(name, 2)
        if not self._v6:
            addr = socket.inet_ntop(socket.AF_INET, name[4:8]), port
        else:
            host = socket.inet_ntop(socket.AF_INET6, name[8:24])
            (scope,) = _SCOPE.unpack_from(name, 24)
            if scope:
                try:
                    host += "%" + socket.if_indextoname(scope)
                except OSError:
                    host += "%" + str(scope)
            addr = host, port
        hosts[key] = addr
        return addr

    # -- sending

    def queue(self, i: int, wire: bytes) -> bool:
        """
        Queue C{wire} for the source of received datagram C{i}; C{False}
        when it is longer than C{size} or C{i} has a reply queued already
        (send it yourself).
        """
        length = len(wire)
        queued = self.queued
        if length > self.size or (queued and queued[-1] >= i):
            return False
        start = i * self.size
        self._data[start : start + length] = wire
        self._iovLengths[i] = length
        queued.append(i)
        return True

    def flush(self) -> int:
        """
        Send every queued reply; return how many were dropped.

        Consecutive slots go with one C{sendmmsg}. It stops at the first
        message that fails after others were sent and returns their count:
        the rest is sent again, and a message that fails first is dropped
        (as a failed C{sendto} is) and the rest sent after it. C{EINTR} is
        retried. Must run before the next L{receive}.
        """
        queued = self.queued
        self.queued = []
        dropped = 0
        at = 0
        total = len(queued)
        send, fd, base = self._send, self._fd, self._address
        while at < total:
            first = queued[at]
            run = 1
            while at + run < total and queued[at + run] == first + run:
                run += 1
            n: int = send(fd, base + first * _HDR, run, MSG_DONTWAIT)
            if n > 0:
                at += n
                continue
            if n < 0 and ctypes.get_errno() == errno.EINTR:
                continue
            at += 1  # the first message failed: drop it, go on with the rest
            dropped += 1
        self._iovecs[:] = self._fullIovecs
        return dropped
