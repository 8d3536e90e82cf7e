"""
fleetd's settings, each TOML key declared once.

A field's type, default and metadata (L{setting}, L{toml}) say how its key
is read, what it defaults to and which values it takes; L{readSection}
reads them all through one L{Table}. The few keys that need their own
parsing name a C{read} function below.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.ssl import Certificate, optionsForClientTLS

from fleetd.config.kms import DEFAULT_LISTEN, KMSSettings, readKMS, readKMSListen
from fleetd.config.provision import ProvisionSettings
from fleetd.config.reader import readSection, setting, toml
from fleetd.config.table import Table
from fleetd.config.tinkerbell import TinkerbellSettings, readTinkerbell
from fleetd.topology import ConfigError, Topology, parseAddress


@dataclass(frozen=True)
class UpstreamAddress:
    """C{tink.upstream}: C{tcp:HOST:PORT} (h2c) or C{tls:HOST:PORT}."""

    tls: bool
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> UpstreamAddress:
        """Raise L{ValueError} with a short reason for anything else."""
        scheme, sep, rest = text.strip().partition(":")
        if not sep or scheme not in ("tcp", "tls"):
            raise ValueError("must be tcp:HOST:PORT (h2c) or tls:HOST:PORT")
        host, sep, port = rest.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be tcp:HOST:PORT (h2c) or tls:HOST:PORT")
        return cls(scheme == "tls", host, int(port))

    def endpoint(
        self, reactor: object, caPEM: bytes | None = None
    ) -> IStreamClientEndpoint:
        plain = HostnameEndpoint(reactor, self.host, self.port)
        if not self.tls:
            return plain
        trust = None if caPEM is None else Certificate.loadPEM(caPEM)
        options = optionsForClientTLS(
            self.host, trustRoot=trust, acceptableProtocols=[b"h2"]
        )
        return wrapClientTLS(options, plain)


def _dnsListen(table: Table) -> tuple[int, str]:
    raw = table.text("dns")
    port, _, rest = raw.partition(":")
    interface = ""
    if rest:
        if not rest.startswith("interface="):
            raise ConfigError(table.key("dns"), "must be PORT or PORT:interface=ADDR")
        interface = parseAddress(table.key("dns"), rest[len("interface=") :])
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(table.key("dns"), f"bad port {port!r}")
    return int(port), interface


ENDPOINT = toml(read=Table.endpoint)


@dataclass(frozen=True)
class Listen:
    """Twisted endpoint descriptions for each listener."""

    boot: str = field(metadata=ENDPOINT)
    device: str = field(metadata=ENDPOINT)
    admin: str = field(metadata=ENDPOINT)
    tink: str = field(metadata=ENDPOINT)
    dns_port: int
    dns_interface: str
    kms: str = field(default=DEFAULT_LISTEN, metadata=toml(read=readKMSListen))


def _listen(parent: Table, name: str) -> Listen:
    """C{[listen]}: C{dns} is one key for the port and the interface."""
    table = parent.section(name)
    port, interface = _dnsListen(table)
    return readSection(Listen, table, dns_port=port, dns_interface=interface)


@dataclass(frozen=True)
class Limits:
    """Connection and request limits applied to every listener."""

    max_connections: int = setting(1024, 1, 1_000_000)
    max_connections_per_source: int = setting(64, 1, 1_000_000)
    idle_timeout: float = setting(30.0, 0.1, 86400.0)
    max_header_bytes: int = setting(8192, 512, 1 << 20)
    max_headers: int = setting(64, 4, 1000)
    max_body_bytes: int = setting(65536, 0, 64 << 20)
    request_timeout: float = setting(10.0, 0.1, 3600.0)
    admin_max_body_bytes: int = setting(8 << 20, 1024, 256 << 20)


@dataclass(frozen=True)
class TLSFiles:
    """The public certificate presented on boot, device, admin and tink."""

    cert: Path
    key: Path
    chain: Path | None = None
    early_ca: Path | None = None  # CAs Talos trusts before its config [A5]


@dataclass(frozen=True)
class PKIFiles:
    """The LDevID issuer and the trust bundle [T4]."""

    issuer_cert: Path
    issuer_key: Path
    bundle: Path
    ldevid_days: int = setting(365, 1, 3650)


_HOST_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


def _consoleHost(table: Table, name: str) -> str | None:
    """C{owner.console_host}: a DNS name (C{localhost} too) or an IP
    address, no scheme, port or path (the port is the admin listener's)."""
    value = table.optstr(name)
    if value is None:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    host = value.rstrip(".").lower()
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(x) for x in host.split(".")):
        raise ConfigError(
            table.key(name), f"must be a host name or an IP address, not {value!r}"
        )
    return host


@dataclass(frozen=True)
class OwnerFiles:
    """The owner CA, the client credentials fleetctl presents, and the
    name a browser reaches the admin listener by (C{fleetctl console}'s
    links; L{None}: the enrollment name)."""

    client_ca: Path
    client_cert: Path | None = None
    client_key: Path | None = None
    server: str = setting("https://localhost:8446")
    server_ca: Path | None = None
    # No declared default (the enrollment name is not a constant).
    console_host: str | None = field(default=None, metadata={"read": _consoleHost})


def _kubeAPI(table: Table, name: str) -> str:
    api = table.text(name)
    if not api.startswith("https://") or len(api) <= len("https://"):
        raise ConfigError(table.key(name), "must be an https:// URL")
    return api


@dataclass(frozen=True)
class KubernetesSettings:
    """The cluster being joined ([kubernetes]; absent = no cluster calls)."""

    api: str = field(metadata=toml(read=_kubeAPI))
    ca: Path | None = None
    token_file: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    # a per-node token's expiration backstop [K1]
    token_ttl: float = setting(86400.0, 600.0, 7 * 86400.0)
    # token deleted this long after approval [K4]
    delete_after: float = setting(60.0, 0.0, 3600.0)
    # old cluster token kept after a rotation [K6]
    rotate_overlap: float = setting(3600.0, 0.0, 30 * 86400.0)
    rbac_check_interval: float = setting(600.0, 10.0, 86400.0)  # [K3]
    timeout: float = setting(15.0, 0.5, 600.0)  # per API call


def _netboxURL(table: Table, name: str) -> str:
    """C{[netbox] url}: http:// or https://, maybe with a base path."""
    url = table.text(name)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            table.key(name), f"{url!r} must be an http:// or https:// URL"
        )
    if parts.query or parts.fragment:
        raise ConfigError(table.key(name), "must not carry a query or fragment")
    return url


@dataclass(frozen=True)
class NetBoxSettings:
    """C{[netbox]}: present, NetBox is the inventory (design.md, State)."""

    url: str = field(metadata=toml(read=_netboxURL))
    token_file: Path
    ca: Path | None = None  # system roots when absent


@dataclass(frozen=True)
class TinkSettings:
    """The tink proxy ([tink]): its upstream and its limits."""

    # From tink.upstream and tink.upstream_ca (L{_tink}).
    upstream_tls: bool = False
    upstream_host: str = "127.0.0.1"
    upstream_port: int = 42114
    upstream_ca: Path | None = None
    connect_timeout: float = setting(5.0, 0.1, 600.0)
    max_concurrent_streams: int = setting(100, 1, 10000)
    max_header_list_size: int = setting(16384, 1024, 1 << 20)
    max_message_bytes: int = setting(4 << 20, 1024, 64 << 20)
    handshake_timeout: float = setting(10.0, 0.1, 600.0)
    stream_timeout: float = setting(300.0, 1.0, 86400.0)
    drain_timeout: float = setting(10.0, 0.0, 600.0)
    # HTTP/2 abuse limits (issue 17): wasted streams per connection before
    # GOAWAY(ENHANCE_YOUR_CALM), new streams per second per source.
    stream_budget: int = setting(32, 1, 100000)
    source_stream_rate: float = setting(20.0, 0.1, 1e9)
    source_stream_burst: float = setting(100.0, 1.0, 1e9)
    min_reboot: float = setting(60.0, 0.0, 3600.0)
    # Boot completion's second "done" signal: "off" or "kubernetes" (read
    # the Workflows' status.state through [kubernetes]); the namespace to
    # watch, None for all namespaces ("*"). Both read by L{_workflowState}.
    workflow_state: str = "off"
    workflow_namespace: str | None = None


@dataclass(frozen=True)
class BootLimits:
    """Brute-force limits on the boot listener (token buckets)."""

    failure_rate: float = setting(1.0, 0.001, 1e6)
    failure_burst: float = setting(20.0, 1.0, 1e7)
    global_failure_rate: float = setting(200.0, 0.001, 1e7)
    global_failure_burst: float = setting(2000.0, 1.0, 1e8)


@dataclass(frozen=True)
class DNSRateLimit:
    """Response-rate limiting of DNS over UDP ([dns.rate_limit]; issue 8)."""

    enabled: bool = setting(True)
    rate: float = setting(20.0, 0.001, 1e6)
    burst: float = setting(40.0, 1.0, 1e7)
    slip: int = setting(2, 0, 10)
    ipv4_prefix: int = setting(24, 8, 32)
    ipv6_prefix: int = setting(56, 16, 128)
    table_size: int = setting(20_000, 16, 10_000_000)


WORKFLOW_STATES = ("off", "kubernetes")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _workflowState(tink: Table) -> tuple[str, str | None]:
    """C{tink.workflow_state} and C{tink.workflow_namespace} (L{None}: all)."""
    state = tink.text("workflow_state", TinkSettings.workflow_state)
    if state not in WORKFLOW_STATES:
        raise ConfigError(tink.key("workflow_state"), 'must be "off" or "kubernetes"')
    namespace = tink.optstr("workflow_namespace")
    if state == "off":
        if namespace is not None:
            raise ConfigError(
                tink.key("workflow_namespace"),
                'only with workflow_state = "kubernetes"',
            )
        return state, None
    if namespace is None:
        raise ConfigError(
            tink.key("workflow_namespace"),
            'missing: the namespace of the Workflows (or "*" for all)',
        )
    if namespace == "*":
        return state, None
    if _NAMESPACE.fullmatch(namespace) is None:
        raise ConfigError(
            tink.key("workflow_namespace"),
            f'{namespace!r} is not a namespace name (or "*" for all)',
        )
    return state, namespace


def _tink(parent: Table, name: str) -> TinkSettings:
    """C{[tink]}: C{upstream} is one key for three fields; the workflow
    keys depend on each other."""
    tink = parent.section(name)
    try:
        upstream = UpstreamAddress.parse(tink.text("upstream"))
    except ValueError as e:
        raise ConfigError(tink.key("upstream"), str(e)) from e
    caPath = tink.optpath("upstream_ca")
    if caPath is not None and not upstream.tls:
        raise ConfigError(tink.key("upstream_ca"), "only for a tls: upstream")
    workflowState, workflowNamespace = _workflowState(tink)
    return readSection(
        TinkSettings,
        tink,
        upstream_tls=upstream.tls,
        upstream_host=upstream.host,
        upstream_port=upstream.port,
        upstream_ca=caPath,
        workflow_state=workflowState,
        workflow_namespace=workflowNamespace,
    )


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything fleetd reads from its configuration file."""

    source: Path
    topology_file: Path  # site.topology, read before the rest
    topology: Topology
    site_name: str = field(metadata=toml(key="site.name"))
    state: Path = field(metadata=toml(key="paths.state"))
    vault: Path = field(metadata=toml(key="paths.vault", read=Table.placedPath))
    vault_allow_any_fs: bool = setting(False, key="paths.vault_allow_any_fs")
    listen: Listen = field(metadata=toml(read=_listen))
    limits: Limits = field(default_factory=Limits)
    tls: TLSFiles
    pki: PKIFiles
    ek_roots: Path = field(metadata=toml(key="attest.ek_roots"))
    challenge_ttl: float = setting(60.0, 5.0, 3600.0, key="attest.challenge_ttl")
    owner: OwnerFiles
    tink: TinkSettings = field(metadata=toml(read=_tink))
    dev_pki: bool = setting(False, key="dev.generate_pki")
    # Fill templates' REPLACE-WITH-... placeholders with generated values
    # instead of refusing them (fleetd.runs.placeholders): development only.
    dev_values: bool = setting(False, key="dev.generate_values")
    dns_ttl: int = setting(60, 0, 86400, key="dns.ttl")
    dns_rate_limit: DNSRateLimit = field(
        default_factory=DNSRateLimit, metadata=toml(key="dns.rate_limit")
    )
    provision: ProvisionSettings = field(default_factory=ProvisionSettings)
    boot_limits: BootLimits = field(
        default_factory=BootLimits, metadata=toml(key="boot")
    )
    kubernetes: KubernetesSettings | None = None
    tinkerbell: TinkerbellSettings | None = field(
        default=None, metadata=toml(read=readTinkerbell)
    )
    netbox: NetBoxSettings | None = None
    kms: KMSSettings | None = field(default=None, metadata=toml(read=readKMS))
