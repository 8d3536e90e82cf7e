"""
C{[provision]}: where the templates live, the device classes the site
defines, and what each class asks of its configuration beyond its
cluster's template (issue 30).

    [provision]
    classes = ["worker", "control-plane"]
    [provision.class.worker]
    disk_encryption = "kms"    # STATE and EPHEMERAL sealed by fleetd's KMS

A C{[provision.class.<name>]} table names a class of C{classes} (else one
line naming it, with a did-you-mean hint); a class without a table asks
nothing. C{disk_encryption = "kms"} needs the C{[kms]} table (checked once
everything is read, L{fleetd.config.load}) and a template with a place for
the section (L{fleetd.runs.diskencryption}).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from fleetd.config.reader import setting, toml
from fleetd.config.table import Table
from fleetd.topology import ConfigError

TEMPLATES = Path("templates")
_CLASS = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
# disk_encryption's values: "none" (the default) or fleetd's own KMS.
DISK_ENCRYPTION = ("none", "kms")
_UNESCAPED_COLON = re.compile(r"(?<!\\):")


def _classes(table: Table, name: str) -> tuple[str, ...]:
    """
    The device classes the site defines: what C{device add} and
    C{device import} accept (issue 19 item 4). Absent, none is defined.
    """
    classes = tuple(c.lower() for c in table.strings(name))
    for c in classes:
        if _CLASS.fullmatch(c) is None:
            raise ConfigError(
                table.key(name),
                f"{c!r} is not a class name (a-z, 0-9 and '-', at most 32)",
            )
    if len(set(classes)) != len(classes):
        raise ConfigError(table.key(name), "names a class twice")
    return classes


@dataclass(frozen=True)
class ProvisionClass:
    """What one device class asks of its configuration."""

    # "kms": the configuration carries machine.systemDiskEncryption for
    # STATE and EPHEMERAL with fleetd's KMS as the key (issue 30).
    disk_encryption: str = "none"


def _perClass(table: Table, name: str) -> dict[str, ProvisionClass]:
    """C{[provision.class.<name>]} tables, by class name."""
    holder = table.table(name, required=False)
    if holder is None:
        return {}
    found: dict[str, ProvisionClass] = {}
    for cls in holder.names():
        sub = holder.table(cls)
        assert sub is not None  # names() lists only what is present
        value = sub.text("disk_encryption", ProvisionClass.disk_encryption)
        if value not in DISK_ENCRYPTION:
            raise ConfigError(
                sub.key("disk_encryption"),
                f'{value!r} must be "kms" (fleetd\'s KMS seals STATE and'
                ' EPHEMERAL) or "none"',
            )
        found[cls] = ProvisionClass(disk_encryption=value)
    return found


@dataclass(frozen=True)
class ProvisionSettings:
    """
    Where templates live, which device classes the site defines, what
    each asks of its configuration, and how long alert series stay up.
    """

    templates: Path = field(default=TEMPLATES, metadata=toml())
    classes: tuple[str, ...] = field(
        default_factory=tuple, metadata=toml(read=_classes)
    )
    default_cluster: str = setting("default")
    alert_hold: float = setting(7200.0, 1.0, 7 * 86400.0)
    per_class: dict[str, ProvisionClass] = field(
        default_factory=dict, metadata=toml(key="class", read=_perClass)
    )

    def __post_init__(self) -> None:
        for cls in self.per_class:
            if cls in self.classes:
                continue
            close = difflib.get_close_matches(cls, list(self.classes), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(
                f"provision.class.{cls}",
                f"unknown class: not one of provision.classes{hint}",
            )

    def diskEncryptionClasses(self) -> tuple[str, ...]:
        """The classes whose configurations carry fleetd's KMS, by name."""
        return tuple(
            sorted(c for c, v in self.per_class.items() if v.disk_encryption == "kms")
        )


def listenPort(description: str) -> int | None:
    """
    The TCP port of a listener's endpoint description (C{tcp:4050},
    C{tcp6:port=4050:interface=\\:\\:}); L{None} for one without a port
    (C{unix:}).
    """
    kind, *args = _UNESCAPED_COLON.split(description.strip())
    if kind.strip().lower() not in ("tcp", "tcp6"):
        return None
    positional = [a for a in args if "=" not in a]
    named = dict(a.split("=", 1) for a in args if "=" in a)
    port = named.get("port", positional[0] if positional else None)
    return int(port) if port is not None and port.isdigit() else None


def kmsPort(provision: ProvisionSettings, kmsListen: str | None) -> int | None:
    """
    The port nodes reach fleetd's KMS on, when a class opts in to disk
    encryption (L{None}: none does).

    @param kmsListen: C{listen.kms} when C{[kms]} is present, else L{None}.
    @raise ConfigError: a class opts in without C{[kms]}, or with a
        C{kms} listener nodes cannot reach by a TCP port.
    """
    classes = provision.diskEncryptionClasses()
    if not classes:
        return None
    if kmsListen is None:
        raise ConfigError(
            f"provision.class.{classes[0]}.disk_encryption",
            '"kms" needs fleetd to be the site\'s KMS, and the [kms] table is absent',
        )
    port = listenPort(kmsListen)
    if port is None:
        raise ConfigError(
            "listen.kms",
            f"{kmsListen!r} has no TCP port for nodes to reach, and class"
            f' {classes[0]} has disk_encryption = "kms"',
        )
    return port
