"""
fleetd's configuration: one TOML file (and its topology) read into frozen
L{Settings}.

Each key is declared once, as a field of a settings dataclass
(L{fleetd.config.settings}); one generic reader (L{fleetd.config.reader})
reads them through L{fleetd.config.table.Table}, which names every problem
by its dotted key and refuses keys nothing reads.
"""

from fleetd.config.kms import KMSSettings
from fleetd.config.load import loadSettings, parseSettings
from fleetd.config.provision import ProvisionClass, ProvisionSettings
from fleetd.config.settings import (
    BootLimits,
    DNSRateLimit,
    KubernetesSettings,
    Limits,
    Listen,
    NetBoxSettings,
    OwnerFiles,
    PKIFiles,
    Settings,
    TinkSettings,
    TLSFiles,
    UpstreamAddress,
)
from fleetd.config.tinkerbell import TinkerbellClass, TinkerbellSettings
from fleetd.topology import (
    Anchor,
    ConfigError,
    Topology,
    loadTopology,
    parseTopology,
)

__all__ = [
    "Anchor",
    "BootLimits",
    "ConfigError",
    "DNSRateLimit",
    "KMSSettings",
    "KubernetesSettings",
    "Limits",
    "Listen",
    "NetBoxSettings",
    "OwnerFiles",
    "PKIFiles",
    "ProvisionClass",
    "ProvisionSettings",
    "Settings",
    "TLSFiles",
    "TinkSettings",
    "TinkerbellClass",
    "TinkerbellSettings",
    "Topology",
    "UpstreamAddress",
    "loadSettings",
    "loadTopology",
    "parseSettings",
    "parseTopology",
]
