"""
C{[tinkerbell]}: fleetd keeps each device's Tinkerbell C{Hardware} and a
C{Workflow} per run (issue 28; docs/enrollment.md, "The Template and the
Workflow").

    [tinkerbell]
    namespace = "tink-system"
    [tinkerbell.classes.worker-g3]
    template = "fleetd-talos-install"
    image = "https://images.example/talos/v1.9.0/metal-amd64.raw.zst"
    toggle_allow_netboot = true

Every value of a class is required (a missing one is one line naming its
key); a class the site does not define (C{provision.classes}) is refused
by L{checkClasses}, once the rest is read. A device whose class has no
table here gets no Tinkerbell object from fleetd.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fleetd.config.table import Table
from fleetd.topology import ConfigError

# A namespace is a DNS label; an object's name a DNS subdomain.
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
# Workflow spec.bootOptions.bootMode fleetd may set (both CRD generations
# know "netboot"; the others need an ISO URL or a BMC job fleetd cannot name).
BOOT_MODES = ("netboot",)


@dataclass(frozen=True)
class TinkerbellClass:
    """What fleetd writes for a device of one class."""

    template: str  # the Template's name (Workflow spec.templateRef)
    image: str  # hardwareMap talos_image: the raw Talos image's URL
    toggle_allow_netboot: bool  # spec.bootOptions.toggleAllowNetboot
    boot_mode: str | None = None  # spec.bootOptions.bootMode, when set


@dataclass(frozen=True)
class TinkerbellSettings:
    """C{[tinkerbell]}: where the objects live, and each class's values."""

    namespace: str
    classes: dict[str, TinkerbellClass] = field(default_factory=dict)

    def forClass(self, name: str) -> TinkerbellClass | None:
        return self.classes.get(name)


def _template(table: Table) -> str:
    name = table.text("template")
    if len(name) > 253 or SUBDOMAIN.fullmatch(name) is None:
        raise ConfigError(
            table.key("template"), f"{name!r} is not a Kubernetes object name"
        )
    return name


def _image(table: Table) -> str:
    url = table.text("image")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            table.key("image"), f"{url!r} must be an http:// or https:// URL"
        )
    return url


def _toggle(table: Table) -> bool:
    name = "toggle_allow_netboot"
    if not table.has(name):
        raise ConfigError(table.key(name), "missing: true or false")
    return table.flag(name, True)


def _bootMode(table: Table) -> str | None:
    mode = table.optstr("boot_mode")
    if mode is not None and mode not in BOOT_MODES:
        raise ConfigError(
            table.key("boot_mode"), f"must be one of {', '.join(BOOT_MODES)}"
        )
    return mode


def _class(table: Table) -> TinkerbellClass:
    return TinkerbellClass(
        template=_template(table),
        image=_image(table),
        toggle_allow_netboot=_toggle(table),
        boot_mode=_bootMode(table),
    )


def readTinkerbell(parent: Table, name: str) -> TinkerbellSettings | None:
    """C{[tinkerbell]}, or L{None} when the table is absent."""
    table = parent.table(name, required=False)
    if table is None:
        return None
    namespace = table.text("namespace")
    if NAMESPACE.fullmatch(namespace) is None:
        raise ConfigError(
            table.key("namespace"), f"{namespace!r} is not a namespace name"
        )
    classes: dict[str, TinkerbellClass] = {}
    holder = table.table("classes", required=False)
    if holder is not None:
        for cls in holder.names():
            sub = holder.table(cls)
            assert sub is not None  # names() lists only what is present
            classes[cls] = _class(sub)
    return TinkerbellSettings(namespace, classes)


def checkClasses(tinkerbell: TinkerbellSettings | None, known: Sequence[str]) -> None:
    """
    Each class of C{[tinkerbell.classes]} is one the site defines
    (C{provision.classes}); else one line naming the first that is not.
    """
    if tinkerbell is None:
        return
    for cls in tinkerbell.classes:
        if cls in known:
            continue
        close = difflib.get_close_matches(cls, list(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"tinkerbell.classes.{cls}",
            f"unknown class: not one of provision.classes{hint}",
        )
