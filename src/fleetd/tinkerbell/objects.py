"""
The objects fleetd writes for Tinkerbell, as plain values (no I/O):

    Hardware  <namespace>/<device>
      metadata.labels: app.kubernetes.io/managed-by=fleetd, fleetd.io/device
      spec.interfaces[]: one per inventory MAC, in inventory order:
        dhcp.mac, dhcp.hostname (the device), dhcp.ip.address on the first
        where the inventory knows one; netboot.allowPXE and allowWorkflow

    Workflow  <namespace>/<device>-<run>
      metadata.labels: the two above, and fleetd.io/run
      spec.templateRef (the class's template), hardwareRef (the device),
      hardwareMap {device_1: the first MAC, talos_image: the class's
      image}, bootOptions {toggleAllowNetboot, bootMode when set}

An existing Hardware fleetd made is updated, not replaced: its other
fields (a BMC reference, metadata, an interface's DHCP details) stay; its
interfaces become the inventory's MACs. Ownership is read from the labels
alone: an object without C{managed-by=fleetd} and the right device (and
run) label is never changed (L{owned}).
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
from collections.abc import Sequence
from typing import Any

from fleetd.config.tinkerbell import TinkerbellClass

API_VERSION = "tinkerbell.org/v1alpha1"
MANAGED_BY = "app.kubernetes.io/managed-by"
FLEETD = "fleetd"
DEVICE_LABEL = "fleetd.io/device"
RUN_LABEL = "fleetd.io/run"


def workflowName(device: str, run: str) -> str:
    """A run's Workflow: named after the device and the run (a DNS
    subdomain: device names are DNS labels, run ids C{r-} and hex)."""
    return f"{device}-{run}"


def labels(device: str, run: str | None = None) -> dict[str, str]:
    found = {MANAGED_BY: FLEETD, DEVICE_LABEL: device}
    if run is not None:
        found[RUN_LABEL] = run
    return found


def owned(obj: dict[str, Any], device: str, run: str | None = None) -> bool:
    """Whether C{obj} carries fleetd's labels for C{device} (and C{run})."""
    found = (obj.get("metadata") or {}).get("labels") or {}
    return all(found.get(k) == v for k, v in labels(device, run).items())


def _interface(
    mac: str, device: str, address: str | None, netboot: bool
) -> dict[str, Any]:
    dhcp: dict[str, Any] = {"mac": mac, "hostname": device}
    if address is not None:
        family = ipaddress.ip_address(address).version
        dhcp["ip"] = {"address": address, "family": family}
    return {"dhcp": dhcp, "netboot": {"allowPXE": netboot, "allowWorkflow": netboot}}


def hardware(
    namespace: str, device: str, macs: Sequence[str], address: str | None = None
) -> dict[str, Any]:
    """A new Hardware for C{device}, network boot and workflows allowed."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Hardware",
        "metadata": {"name": device, "namespace": namespace, "labels": labels(device)},
        "spec": {
            "interfaces": [
                _interface(m, device, address if i == 0 else None, True)
                for i, m in enumerate(macs)
            ],
        },
    }


def updatedHardware(
    existing: dict[str, Any],
    device: str,
    macs: Sequence[str],
    address: str | None = None,
) -> dict[str, Any]:
    """
    C{existing} (fleetd's) with one interface per MAC of C{macs}, network
    boot and workflows allowed: an interface already there for a MAC keeps
    its other fields; one for a MAC the inventory no longer has goes.
    """
    updated = copy.deepcopy(existing)
    spec = updated.setdefault("spec", {})
    byMac = {
        str((i.get("dhcp") or {}).get("mac", "")).lower(): i
        for i in spec.get("interfaces") or []
        if isinstance(i, dict)
    }
    interfaces = []
    for i, mac in enumerate(macs):
        fresh = _interface(mac, device, address if i == 0 else None, True)
        found = byMac.get(mac)
        if found is None:
            interfaces.append(fresh)
            continue
        kept = copy.deepcopy(found)
        kept.setdefault("dhcp", {}).update(fresh["dhcp"])
        kept.setdefault("netboot", {}).update(fresh["netboot"])
        interfaces.append(kept)
    spec["interfaces"] = interfaces
    return updated


def netbootOff(existing: dict[str, Any]) -> dict[str, Any]:
    """C{existing} with C{allowPXE} and C{allowWorkflow} false everywhere."""
    updated = copy.deepcopy(existing)
    for interface in (updated.get("spec") or {}).get("interfaces") or []:
        if isinstance(interface, dict):
            netboot = interface.setdefault("netboot", {})
            netboot["allowPXE"] = False
            netboot["allowWorkflow"] = False
    return updated


def netbootIsOff(obj: dict[str, Any]) -> bool:
    interfaces = (obj.get("spec") or {}).get("interfaces") or []
    return all(
        not (i.get("netboot") or {}).get("allowPXE")
        and not (i.get("netboot") or {}).get("allowWorkflow")
        for i in interfaces
        if isinstance(i, dict)
    )


def workflow(
    namespace: str, device: str, run: str, mac: str, cls: TinkerbellClass
) -> dict[str, Any]:
    """The Workflow of C{device}'s run C{run}: the class's Template, the
    agent (C{mac}) and the class's image."""
    boot: dict[str, Any] = {"toggleAllowNetboot": cls.toggle_allow_netboot}
    if cls.boot_mode is not None:
        boot["bootMode"] = cls.boot_mode
    return {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": workflowName(device, run),
            "namespace": namespace,
            "labels": labels(device, run),
        },
        "spec": {
            "templateRef": cls.template,
            "hardwareRef": device,
            "hardwareMap": {"device_1": mac, "talos_image": cls.image},
            "bootOptions": boot,
        },
    }


def specDigest(obj: dict[str, Any]) -> str:
    """A digest of C{obj}'s spec: what fleetd wrote, to tell an edit."""
    spec = json.dumps(obj.get("spec") or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(spec.encode("utf-8")).hexdigest()


def uidOf(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def stateOf(obj: dict[str, Any]) -> str | None:
    """A Workflow's C{status.state} as Tinkerbell wrote it, if any."""
    state = (obj.get("status") or {}).get("state")
    return state if isinstance(state, str) and state else None


def namesDevice(obj: dict[str, Any], device: str, macs: Sequence[str]) -> bool:
    """Whether a Workflow would run on C{device}: its Hardware, or its
    agent (C{hardwareMap.device_1}) one of the device's MACs."""
    spec = obj.get("spec") or {}
    agent = str((spec.get("hardwareMap") or {}).get("device_1") or "").lower()
    return spec.get("hardwareRef") == device or (bool(agent) and agent in macs)
