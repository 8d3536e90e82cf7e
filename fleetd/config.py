"""
Load fleetd's TOML configuration (and, through L{fleetd.topology}, the
site topology) into frozen settings.

Every problem is reported as one L{ConfigError} whose message starts with the
dotted key it concerns, so start-up can print a single clear line.
Relative paths are resolved against the directory of the config file.

A key or table that nothing reads is an error (section 3): each L{_Table}
records the names asked of it, whether present or not, and
L{checkUnknownKeys} runs after parsing. A key read through the accessors
is therefore known without a list to keep in step.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twisted.internet.endpoints import (
    TCP4ServerEndpoint,
    TCP6ServerEndpoint,
    UNIXServerEndpoint,
    serverFromString,
)

from fleetd.topology import (
    Anchor,
    ConfigError,
    Topology,
    loadTopology,
    parseAddress,
    parseTopology,
)


@dataclass(frozen=True)
class Listen:
    """Twisted endpoint descriptions for each listener."""

    boot: str
    device: str
    admin: str
    tink: str
    dns_port: int
    dns_interface: str


@dataclass(frozen=True)
class Limits:
    """Connection and request limits applied to every listener."""

    max_connections: int = 1024
    max_connections_per_source: int = 64
    idle_timeout: float = 30.0
    max_header_bytes: int = 8192
    max_headers: int = 64
    max_body_bytes: int = 65536
    admin_max_body_bytes: int = 8 << 20
    request_timeout: float = 10.0


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
    ldevid_days: int = 365


@dataclass(frozen=True)
class OwnerFiles:
    """The owner CA, and the client credentials fleetctl presents."""

    client_ca: Path
    client_cert: Path | None
    client_key: Path | None
    server: str
    server_ca: Path | None


@dataclass(frozen=True)
class KubernetesSettings:
    """The cluster being joined ([kubernetes]; absent = no cluster calls)."""

    api: str
    ca: Path | None
    token_file: Path | None
    client_cert: Path | None
    client_key: Path | None
    token_ttl: float = 86400.0  # a per-node token's expiration backstop [K1]
    delete_after: float = 60.0  # token deleted this long after approval [K4]
    rotate_overlap: float = 3600.0  # old cluster token kept after a rotation [K6]
    rbac_check_interval: float = 600.0  # [K3]
    timeout: float = 15.0  # per API call


@dataclass(frozen=True)
class NetBoxSettings:
    """C{[netbox]}: present, NetBox is the inventory (DESIGN section 4)."""

    url: str
    token_file: Path
    ca: Path | None = None  # system roots when absent


@dataclass(frozen=True)
class ProvisionSettings:
    """Where templates live and how long alert series stay up."""

    templates: Path
    default_cluster: str = "default"
    alert_hold: float = 7200.0


@dataclass(frozen=True)
class TinkSettings:
    """The tink proxy ([tink]): its upstream and its limits."""

    upstream_tls: bool = False
    upstream_host: str = "127.0.0.1"
    upstream_port: int = 42114
    upstream_ca: Path | None = None
    connect_timeout: float = 5.0
    max_concurrent_streams: int = 100
    max_header_list_size: int = 16384
    max_message_bytes: int = 4 << 20
    handshake_timeout: float = 10.0
    stream_timeout: float = 300.0
    drain_timeout: float = 10.0
    # HTTP/2 abuse limits (issue 17): wasted streams per connection before
    # GOAWAY(ENHANCE_YOUR_CALM), new streams per second per source.
    stream_budget: int = 32
    source_stream_rate: float = 20.0
    source_stream_burst: float = 100.0
    min_reboot: float = 60.0
    # Boot completion's second "done" signal: "off" or "kubernetes" (read
    # the Workflows' status.state through [kubernetes]); the namespace to
    # watch, None for all namespaces ("*").
    workflow_state: str = "off"
    workflow_namespace: str | None = None


@dataclass(frozen=True)
class BootLimits:
    """Brute-force limits on the boot listener (token buckets)."""

    failure_rate: float = 1.0
    failure_burst: float = 20.0
    global_failure_rate: float = 200.0
    global_failure_burst: float = 2000.0


@dataclass(frozen=True)
class DNSRateLimit:
    """Response-rate limiting of DNS over UDP ([dns.rate_limit]; issue 8)."""

    enabled: bool = True
    rate: float = 20.0
    burst: float = 40.0
    slip: int = 2
    ipv4_prefix: int = 24
    ipv6_prefix: int = 56
    table_size: int = 20_000


@dataclass(frozen=True)
class Settings:
    """Everything fleetd reads from its configuration file."""

    source: Path
    site_name: str
    topology_file: Path
    topology: Topology
    state: Path
    vault: Path
    vault_allow_any_fs: bool
    listen: Listen
    limits: Limits
    tls: TLSFiles
    pki: PKIFiles
    ek_roots: Path
    owner: OwnerFiles
    tink_upstream: str
    dev_pki: bool
    dns_ttl: int = 60
    challenge_ttl: float = 60.0
    dns_rate_limit: DNSRateLimit = field(default_factory=DNSRateLimit)
    provision: ProvisionSettings = field(
        default_factory=lambda: ProvisionSettings(Path("templates"))
    )
    boot_limits: BootLimits = field(default_factory=BootLimits)
    tink: TinkSettings = field(default_factory=TinkSettings)
    kubernetes: KubernetesSettings | None = None
    netbox: NetBoxSettings | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class _Table:
    """
    Typed access to one TOML table, naming keys by their dotted path.

    Every name asked of the table (present or not) is recorded as known;
    L{checkUnknownKeys} refuses whatever the document holds beyond that.
    """

    def __init__(self, data: Mapping[str, Any], prefix: str, base: Path) -> None:
        self._data = data
        self._prefix = prefix
        self._base = base
        self._known: set[str] = set()
        self._tables: dict[str, _Table] = {}

    def key(self, name: str) -> str:
        return f"{self._prefix}.{name}" if self._prefix else name

    def _get(self, name: str, default: Any = None) -> Any:
        self._known.add(name)
        return self._data.get(name, default)

    def table(self, name: str, required: bool = True) -> _Table | None:
        value = self._get(name)
        if value is None:
            if required:
                raise ConfigError(self.key(name), "missing table" + self._hint(name))
            return None
        if not isinstance(value, dict):
            raise ConfigError(self.key(name), "must be a table")
        if name not in self._tables:
            self._tables[name] = _Table(value, self.key(name), self._base)
        return self._tables[name]

    def unknown(self) -> list[ConfigError]:
        """Every key or table here and below that nothing has read."""
        errors = []
        for name, value in self._data.items():
            if name in self._known:
                continue
            kind = "table" if _isTable(value) else "key"
            errors.append(
                ConfigError(self.key(name), f"unknown {kind}" + self._near(name))
            )
        for table in self._tables.values():
            errors.extend(table.unknown())
        return errors

    def _near(self, name: str) -> str:
        """A hint naming the known key closest to the unknown C{name}."""
        close = difflib.get_close_matches(name, sorted(self._known), n=1, cutoff=0.75)
        return f" (did you mean {self.key(close[0])}?)" if close else ""

    def _hint(self, name: str) -> str:
        """A hint naming an unread key present here that looks like C{name}."""
        present = sorted(k for k in self._data if k not in self._known)
        close = difflib.get_close_matches(name, present, n=1, cutoff=0.75)
        return f" (found {self.key(close[0])}: a typo?)" if close else ""

    def text(self, name: str, default: str | None = None) -> str:
        value = self._get(name, default)
        if value is None:
            raise ConfigError(self.key(name), "missing" + self._hint(name))
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(self.key(name), "must be a non-empty string")
        return value

    def optstr(self, name: str) -> str | None:
        if self._get(name) is None:
            return None
        return self.text(name)

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.key(name), "must be an integer")
        if not low <= value <= high:
            raise ConfigError(self.key(name), f"must be between {low} and {high}")
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.key(name), "must be a number")
        if not low <= value <= high:
            raise ConfigError(self.key(name), f"must be between {low} and {high}")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise ConfigError(self.key(name), "must be true or false")
        return value

    def path(self, name: str, default: str | None = None) -> Path:
        return self._resolve(self.text(name, default))

    def optpath(self, name: str) -> Path | None:
        value = self.optstr(name)
        return None if value is None else self._resolve(value)

    def endpoint(self, name: str) -> str:
        description = self.text(name)
        kind = description.split(":", 1)[0].strip().lower()
        if kind not in ("tcp", "tcp6", "unix"):
            raise ConfigError(
                self.key(name),
                "only tcp:, tcp6: and unix: endpoints; TLS is configured in [tls]",
            )
        try:
            # Parsing only: no reactor is touched until listen() is called.
            endpoint = serverFromString(None, description)
        except Exception as e:  # the parsers raise many kinds
            raise ConfigError(self.key(name), f"bad endpoint description: {e}") from e
        allowed = (TCP4ServerEndpoint, TCP6ServerEndpoint, UNIXServerEndpoint)
        if not isinstance(endpoint, allowed):
            raise ConfigError(
                self.key(name),
                "only tcp:, tcp6: and unix: endpoints; TLS is configured in [tls]",
            )
        return description

    def _resolve(self, value: str) -> Path:
        return Path(os.path.normpath(self._base / value))


def _isTable(value: object) -> bool:
    """A TOML table, or an array of tables (C{[[name]]})."""
    if isinstance(value, list) and value:
        return all(isinstance(item, dict) for item in value)
    return isinstance(value, dict)


def checkUnknownKeys(root: _Table) -> None:
    """
    Raise L{ConfigError} for the first key or table (in document order,
    tables before their sub-tables) that nothing read: a typo must never
    fall back silently to a default (section 3).
    """
    errors = root.unknown()
    if errors:
        raise errors[0]


def _dnsListen(table: _Table) -> tuple[int, str]:
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


def _netboxURL(table: _Table) -> str:
    """C{[netbox] url}: http:// or https://, maybe with a base path."""
    from urllib.parse import urlsplit

    url = table.text("url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            table.key("url"), f"{url!r} must be an http:// or https:// URL"
        )
    if parts.query or parts.fragment:
        raise ConfigError(table.key("url"), "must not carry a query or fragment")
    return url


def _kubernetes(kube: _Table) -> KubernetesSettings:
    api = kube.text("api")
    if not api.startswith("https://") or len(api) <= len("https://"):
        raise ConfigError(kube.key("api"), "must be an https:// URL")
    return KubernetesSettings(
        api=api,
        ca=kube.optpath("ca"),
        token_file=kube.optpath("token_file"),
        client_cert=kube.optpath("client_cert"),
        client_key=kube.optpath("client_key"),
        token_ttl=kube.number("token_ttl", 86400.0, 600.0, 7 * 86400.0),
        delete_after=kube.number("delete_after", 60.0, 0.0, 3600.0),
        rotate_overlap=kube.number("rotate_overlap", 3600.0, 0.0, 30 * 86400.0),
        rbac_check_interval=kube.number("rbac_check_interval", 600.0, 10.0, 86400.0),
        timeout=kube.number("timeout", 15.0, 0.5, 600.0),
    )


def _checkKubeCredentials(kube: KubernetesSettings | None) -> None:
    """One way to authenticate to the cluster: a token file or a client cert."""
    if kube is None:
        return
    cert = kube.client_cert is not None or kube.client_key is not None
    if kube.token_file is not None and cert:
        raise ConfigError(
            "kubernetes.token_file",
            "give token_file or client_cert and client_key, not both",
        )
    if kube.token_file is None and (
        kube.client_cert is None or kube.client_key is None
    ):
        raise ConfigError(
            "kubernetes.token_file",
            "missing: a bearer token file, or both client_cert and client_key",
        )


WORKFLOW_STATES = ("off", "kubernetes")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _workflowState(tink: _Table) -> tuple[str, str | None]:
    """C{tink.workflow_state} and C{tink.workflow_namespace} (L{None}: all)."""
    state = tink.text("workflow_state", "off")
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


def _tinkSettings(tink: _Table) -> TinkSettings:
    from fleetd.h2.upstream import UpstreamAddress

    try:
        upstream = UpstreamAddress.parse(tink.text("upstream"))
    except ValueError as e:
        raise ConfigError(tink.key("upstream"), str(e)) from e
    caPath = tink.optpath("upstream_ca")
    if caPath is not None and not upstream.tls:
        raise ConfigError(tink.key("upstream_ca"), "only for a tls: upstream")
    workflowState, workflowNamespace = _workflowState(tink)
    return TinkSettings(
        upstream_tls=upstream.tls,
        upstream_host=upstream.host,
        upstream_port=upstream.port,
        upstream_ca=caPath,
        connect_timeout=tink.number("connect_timeout", 5.0, 0.1, 600.0),
        max_concurrent_streams=tink.integer("max_concurrent_streams", 100, 1, 10000),
        max_header_list_size=tink.integer("max_header_list_size", 16384, 1024, 1 << 20),
        max_message_bytes=tink.integer("max_message_bytes", 4 << 20, 1024, 64 << 20),
        handshake_timeout=tink.number("handshake_timeout", 10.0, 0.1, 600.0),
        stream_timeout=tink.number("stream_timeout", 300.0, 1.0, 86400.0),
        drain_timeout=tink.number("drain_timeout", 10.0, 0.0, 600.0),
        stream_budget=tink.integer("stream_budget", 32, 1, 100000),
        source_stream_rate=tink.number("source_stream_rate", 20.0, 0.1, 1e9),
        source_stream_burst=tink.number("source_stream_burst", 100.0, 1.0, 1e9),
        min_reboot=tink.number("min_reboot", 60.0, 0.0, 3600.0),
        workflow_state=workflowState,
        workflow_namespace=workflowNamespace,
    )


def parseSettings(data: Mapping[str, Any], source: Path) -> Settings:
    """Turn a parsed TOML document into L{Settings}."""
    base = source.parent
    root = _Table(data, "", base)
    site = root.table("site")
    paths = root.table("paths")
    listen = root.table("listen")
    tls = root.table("tls")
    pki = root.table("pki")
    attest = root.table("attest")
    owner = root.table("owner")
    tink = root.table("tink")
    assert site and paths and listen and tls and pki and attest and owner and tink
    limits = root.table("limits", required=False) or _Table({}, "limits", base)
    dev = root.table("dev", required=False) or _Table({}, "dev", base)
    dnsTable = root.table("dns", required=False) or _Table({}, "dns", base)
    provision = root.table("provision", required=False) or _Table({}, "provision", base)
    boot = root.table("boot", required=False) or _Table({}, "boot", base)
    rrl = dnsTable.table("rate_limit", required=False) or _Table(
        {}, "dns.rate_limit", base
    )

    topologyFile = site.path("topology")
    dnsPort, dnsInterface = _dnsListen(listen)
    kube = root.table("kubernetes", required=False)
    netbox = root.table("netbox", required=False)
    settings = Settings(
        source=source,
        site_name=site.text("name"),
        topology_file=topologyFile,
        topology=loadTopology(topologyFile),
        state=paths.path("state"),
        vault=paths.path("vault"),
        vault_allow_any_fs=paths.flag("vault_allow_any_fs", False),
        listen=Listen(
            boot=listen.endpoint("boot"),
            device=listen.endpoint("device"),
            admin=listen.endpoint("admin"),
            tink=listen.endpoint("tink"),
            dns_port=dnsPort,
            dns_interface=dnsInterface,
        ),
        limits=Limits(
            max_connections=limits.integer("max_connections", 1024, 1, 1_000_000),
            max_connections_per_source=limits.integer(
                "max_connections_per_source", 64, 1, 1_000_000
            ),
            idle_timeout=limits.number("idle_timeout", 30.0, 0.1, 86400.0),
            max_header_bytes=limits.integer("max_header_bytes", 8192, 512, 1 << 20),
            max_headers=limits.integer("max_headers", 64, 4, 1000),
            max_body_bytes=limits.integer("max_body_bytes", 65536, 0, 64 << 20),
            request_timeout=limits.number("request_timeout", 10.0, 0.1, 3600.0),
            admin_max_body_bytes=limits.integer(
                "admin_max_body_bytes", 8 << 20, 1024, 256 << 20
            ),
        ),
        tls=TLSFiles(
            tls.path("cert"),
            tls.path("key"),
            tls.optpath("chain"),
            tls.optpath("early_ca"),
        ),
        pki=PKIFiles(
            pki.path("issuer_cert"),
            pki.path("issuer_key"),
            pki.path("bundle"),
            ldevid_days=pki.integer("ldevid_days", 365, 1, 3650),
        ),
        ek_roots=attest.path("ek_roots"),
        challenge_ttl=attest.number("challenge_ttl", 60.0, 5.0, 3600.0),
        owner=OwnerFiles(
            client_ca=owner.path("client_ca"),
            client_cert=owner.optpath("client_cert"),
            client_key=owner.optpath("client_key"),
            server=owner.text("server", "https://localhost:8446"),
            server_ca=owner.optpath("server_ca"),
        ),
        tink_upstream=tink.text("upstream"),
        tink=_tinkSettings(tink),
        dev_pki=dev.flag("generate_pki", False),
        dns_ttl=dnsTable.integer("ttl", 60, 0, 86400),
        dns_rate_limit=DNSRateLimit(
            enabled=rrl.flag("enabled", True),
            rate=rrl.number("rate", 20.0, 0.001, 1e6),
            burst=rrl.number("burst", 40.0, 1.0, 1e7),
            slip=rrl.integer("slip", 2, 0, 10),
            ipv4_prefix=rrl.integer("ipv4_prefix", 24, 8, 32),
            ipv6_prefix=rrl.integer("ipv6_prefix", 56, 16, 128),
            table_size=rrl.integer("table_size", 20_000, 16, 10_000_000),
        ),
        provision=ProvisionSettings(
            templates=provision.path("templates", "templates"),
            default_cluster=provision.text("default_cluster", "default"),
            alert_hold=provision.number("alert_hold", 7200.0, 1.0, 7 * 86400.0),
        ),
        boot_limits=BootLimits(
            failure_rate=boot.number("failure_rate", 1.0, 0.001, 1e6),
            failure_burst=boot.number("failure_burst", 20.0, 1.0, 1e7),
            global_failure_rate=boot.number("global_failure_rate", 200.0, 0.001, 1e7),
            global_failure_burst=boot.number("global_failure_burst", 2000.0, 1.0, 1e8),
        ),
        kubernetes=None if kube is None else _kubernetes(kube),
        netbox=None
        if netbox is None
        else NetBoxSettings(
            url=_netboxURL(netbox),
            token_file=netbox.path("token_file"),
            ca=netbox.optpath("ca"),
        ),
        extra=data,
    )
    checkUnknownKeys(root)
    _checkKubeCredentials(settings.kubernetes)
    if settings.tink.workflow_state == "kubernetes" and settings.kubernetes is None:
        raise ConfigError(
            "tink.workflow_state",
            '"kubernetes" reads Workflows through [kubernetes], which is absent',
        )
    return settings


def loadSettings(path: Path) -> Settings:
    """Read the TOML file at C{path} and its topology file."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from e
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("config", f"{path} is not valid TOML: {e}") from e
    return parseSettings(data, path.resolve())


__all__ = [
    "Anchor",
    "ConfigError",
    "Settings",
    "Topology",
    "loadSettings",
    "loadTopology",
    "parseSettings",
    "parseTopology",
]
