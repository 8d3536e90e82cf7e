"""
C{fleetctl dns-check}: do the anchors, the fallback and the certificates agree?

Checks, one line each [A5]:

  - C{dns}: every anchor's DNS server from the topology, then fleetd's own
    fallback responder, is asked for the enrollment name's A record over UDP
    (TCP if truncated); the answer (CNAMEs followed) must be exactly
    SPORE_BOOTSTRAP_IP [A1], and fleetd's must be authoritative;
  - C{tls}: the boot listener and the Tink listener (offering ALPN h2, which
    it must select) must present a certificate that covers the enrollment
    name (service-identity) and has more than C{--min-days} days left;
  - C{chain}: that certificate, with the intermediates the listener sends,
    must chain to a root Talos trusts before it has a configuration: the
    Mozilla roots as C{certifi} ships them (what Talos bundles), plus the
    site's C{tls.early_ca}. A self-signed or privately issued certificate
    fails, as it would for a node.

Synchronous: a command-line client, never run on fleetd's reactor.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import IO, Any

import certifi
import dns.exception
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import service_identity
from cryptography import x509
from service_identity.cryptography import verify_certificate_hostname

from fleetd.clitools import writeJSON
from fleetd.config import Settings

DNS_PORT = 53
_ANY = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


@dataclass(frozen=True)
class Check:
    """The outcome of one check."""

    check: str
    target: str
    ok: bool
    detail: str

    def line(self) -> str:
        status = "OK" if self.ok else "FAIL"
        return f"{status} {self.check} {self.target}: {self.detail}"


def addCommands(commands: Any) -> None:
    """Register C{dns-check} on fleetctl's subcommand parsers."""
    dns = commands.add_parser(
        "dns-check", help="check anchors, fallback and certificates"
    )
    addArguments(dns)
    dns.set_defaults(handler=cmdDNSCheck)


def cmdDNSCheck(settings: Settings, args: argparse.Namespace, out: IO[str]) -> int:
    return dnsCheck(
        settings,
        timeout=args.timeout,
        minDays=args.min_days,
        out=out,
        jsonOutput=args.json,
    )


def addArguments(parser: argparse.ArgumentParser) -> None:
    """Add dns-check's options to C{parser}."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        help="seconds to wait for each server (default 2.0)",
    )
    parser.add_argument(
        "--min-days",
        type=int,
        default=14,
        help="fail when a certificate has this many days left or fewer (default 14)",
    )


def _hostPort(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def checkDNS(
    label: str,
    host: str,
    port: int,
    name: str,
    expected: str,
    *,
    timeout: float,
    authoritative: bool = False,
) -> Check:
    """Ask C{host} for C{name}'s A record and compare it with C{expected}."""
    target = f"{label} {host if port == DNS_PORT else _hostPort(host, port)}"
    query = dns.message.make_query(name, dns.rdatatype.A)
    try:
        response, _ = dns.query.udp_with_fallback(
            query, host, timeout=timeout, port=port
        )
    except dns.exception.Timeout:
        return Check("dns", target, False, f"timeout after {timeout}s")
    except OSError as e:
        return Check("dns", target, False, f"cannot query: {e.strerror or e}")
    except dns.exception.DNSException as e:
        return Check("dns", target, False, f"bad response: {e}")
    rcode = dns.rcode.to_text(response.rcode())
    if response.rcode() != dns.rcode.NOERROR:
        return Check("dns", target, False, f"{rcode} for {name} A")
    if not isinstance(response, dns.message.QueryMessage):
        return Check("dns", target, False, "bad response: not a query response")
    try:
        rrset = response.resolve_chaining().answer
    except dns.exception.DNSException as e:
        return Check("dns", target, False, f"bad answer: {e}")
    got = sorted(rdata.to_text() for rdata in rrset or ())
    if not got:
        return Check("dns", target, False, f"no A record for {name}")
    shown = f"A {name} = {', '.join(got)}"
    if got != [expected]:
        return Check("dns", target, False, f"{shown}, expected {expected}")
    if authoritative and not response.flags & dns.flags.AA:
        return Check("dns", target, False, f"{shown} without the AA flag")
    return Check("dns", target, True, shown)


def endpointAddress(description: str) -> tuple[str, int] | str:
    """
    Where to connect to reach a server endpoint description.

    C{tcp:PORT[:interface=ADDR]} and C{tcp6:...} give C{(host, port)},
    unspecified interfaces meaning loopback; C{unix:PATH} gives the path.
    """
    fields: list[str] = [""]
    chars = iter(description)
    for c in chars:
        if c == "\\":
            fields[-1] += next(chars, "")
        elif c == ":":
            fields.append("")
        else:
            fields[-1] += c
    kind, args = fields[0], fields[1:]
    positional = [a for a in args if "=" not in a]
    keywords = dict(a.split("=", 1) for a in args if "=" in a)
    if kind == "unix":
        return keywords.get("address") or positional[0]
    if kind not in ("tcp", "tcp6"):
        raise ValueError(f"cannot check a {kind!r} endpoint")
    port = int(keywords.get("port") or positional[0])
    interface = keywords.get("interface", "::" if kind == "tcp6" else "")
    return _ANY.get(interface, interface), port


def _connect(where: str | tuple[str, int], timeout: float) -> socket.socket:
    """A connected socket to a listener's address (a unix path or host:port)."""
    if isinstance(where, str):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.settimeout(timeout)
        raw.connect(where)
        return raw
    return socket.create_connection(where, timeout=timeout)


def checkTLS(
    label: str,
    description: str,
    name: str,
    *,
    timeout: float,
    minDays: int,
    now: float,
    alpn: str | None = None,
) -> Check:
    """Connect to the listener at C{description} and judge its certificate."""
    try:
        where = endpointAddress(description)
    except (ValueError, IndexError) as e:
        return Check("tls", label, False, f"bad endpoint {description!r}: {e}")
    target = f"{label} {where if isinstance(where, str) else _hostPort(*where)}"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The chain is not what this check is about; coverage and expiry are.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if alpn is not None:
        context.set_alpn_protocols([alpn])
    try:
        raw = _connect(where, timeout)
        with raw, context.wrap_socket(raw, server_hostname=name) as tls:
            der = tls.getpeercert(binary_form=True)
            selected = tls.selected_alpn_protocol()
    except TimeoutError:
        return Check("tls", target, False, f"timeout after {timeout}s")
    except ssl.SSLError as e:
        offered = "" if alpn is None else f" (ALPN {alpn} offered)"
        reason = e.reason or e
        return Check("tls", target, False, f"TLS handshake failed{offered}: {reason}")
    except OSError as e:
        return Check("tls", target, False, f"cannot connect: {e.strerror or e}")
    if not der:
        return Check("tls", target, False, "no certificate presented")
    certificate = x509.load_der_x509_certificate(der)
    try:
        verify_certificate_hostname(certificate, name)
    except (service_identity.VerificationError, service_identity.CertificateError):
        names = ", ".join(_dnsNames(certificate)) or "no DNS names"
        return Check(
            "tls", target, False, f"certificate does not cover {name} ({names})"
        )
    left = certificate.not_valid_after_utc.timestamp() - now
    days = int(left // 86400)
    if left <= 0:
        ago = int(-left // 86400)
        return Check("tls", target, False, f"certificate expired {ago} days ago")
    if left <= minDays * 86400:
        detail = f"certificate covers {name}, only {days} days left"
        return Check("tls", target, False, f"{detail} (--min-days {minDays})")
    detail = f"certificate covers {name}, {days} days left"
    if alpn is not None:
        if selected != alpn:
            detail += f", but ALPN {alpn} not selected"
            return Check("tls", target, False, detail)
        detail += f", ALPN {alpn}"
    return Check("tls", target, True, detail)


def trustContext(earlyCA: str | None = None) -> ssl.SSLContext:
    """A client context trusting what Talos trusts before its config [A5]."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # the name is the C{tls} check's business
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=certifi.where())
    if earlyCA is not None:
        context.load_verify_locations(cafile=earlyCA)
    return context


def checkChain(
    label: str,
    description: str,
    name: str,
    *,
    timeout: float,
    earlyCA: str | None = None,
    alpn: str | None = None,
) -> Check:
    """
    Connect again, verifying the chain the listener sends against certifi's
    roots and the site's early CAs: a node does no less before it has a
    configuration.
    """
    try:
        where = endpointAddress(description)
    except (ValueError, IndexError) as e:
        return Check("chain", label, False, f"bad endpoint {description!r}: {e}")
    target = f"{label} {where if isinstance(where, str) else _hostPort(*where)}"
    try:
        context = trustContext(earlyCA)
    except (OSError, ssl.SSLError) as e:
        return Check("chain", target, False, f"cannot load tls.early_ca: {e}")
    if alpn is not None:
        context.set_alpn_protocols([alpn])
    roots = "certifi's roots" + (" and tls.early_ca" if earlyCA else "")
    try:
        raw = _connect(where, timeout)
        with raw, context.wrap_socket(raw, server_hostname=name):
            pass
    except ssl.SSLCertVerificationError as e:
        reason = e.verify_message or e.reason or str(e)
        return Check("chain", target, False, f"does not chain to {roots}: {reason}")
    except TimeoutError:
        return Check("chain", target, False, f"timeout after {timeout}s")
    except ssl.SSLError as e:
        return Check("chain", target, False, f"TLS handshake failed: {e.reason or e}")
    except OSError as e:
        return Check("chain", target, False, f"cannot connect: {e.strerror or e}")
    return Check("chain", target, True, f"chains to {roots}")


def _dnsNames(certificate: x509.Certificate) -> list[str]:
    try:
        extensions = certificate.extensions
        san = extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(san.value.get_values_for_type(x509.DNSName))


def dnsCheck(
    settings: Settings,
    *,
    timeout: float,
    minDays: int,
    out: IO[str],
    jsonOutput: bool,
    anchorPorts: Mapping[str, int] | None = None,
    clock: Callable[[], float] = time.time,
) -> int:
    """
    Run every check, print one line each (or one JSON object), return 0 or 1.

    @param anchorPorts: DNS ports by anchor name instead of 53 (tests).
    @param clock: the current POSIX time, for certificate expiry.
    """
    topology = settings.topology
    name, expected = topology.enrollment_name, topology.spore_bootstrap_ip
    ports = anchorPorts or {}
    checks = [
        checkDNS(
            a.name, a.dns, ports.get(a.name, DNS_PORT), name, expected, timeout=timeout
        )
        for a in topology.anchors
    ]
    interface = settings.listen.dns_interface
    checks.append(
        checkDNS(
            "fleetd",
            _ANY.get(interface, interface),
            settings.listen.dns_port,
            name,
            expected,
            timeout=timeout,
            authoritative=True,
        )
    )
    now = clock()
    earlyCA = settings.tls.early_ca
    for label, description, alpn in (
        ("boot", settings.listen.boot, None),
        ("tink", settings.listen.tink, "h2"),
    ):
        checks.append(
            checkTLS(
                label,
                description,
                name,
                timeout=timeout,
                minDays=minDays,
                now=now,
                alpn=alpn,
            )
        )
        checks.append(
            checkChain(
                label,
                description,
                name,
                timeout=timeout,
                earlyCA=None if earlyCA is None else str(earlyCA),
                alpn=alpn,
            )
        )
    ok = all(c.ok for c in checks)
    if jsonOutput:
        document = {"ok": ok, "checks": [asdict(c) for c in checks]}
        writeJSON(out, document)
    else:
        for c in checks:
            out.write(c.line() + "\n")
    return 0 if ok else 1
