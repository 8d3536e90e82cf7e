"""
The owner's provision (C{fleetctl provision}, the console's device page),
free of HTTP: L{Provisioner} starts runs, one per device, all or none.

All devices are checked before any run starts: unknown devices, refused
classes [T2], a serial NetBox holds more than once (design.md, State), a
broken template or a full vault refuse the whole request, and nothing
changes [J1]. A template that cannot be rendered (an unfilled placeholder
included, issue 27) is refused naming the device and its cluster,
journaled as C{provision.refused} (reason C{template}) like the other
refusals; it is checked before any bootstrap token, vault file or run is
made. While the inventory cannot be asked (NetBox down, or refusing
fleetd's token) the refusal is C{busy}: a device is never provisioned
from a cache (issue 17 items 11 and 12).

Every refusal is a L{Refused} with an owner-side reason code
(L{fleetd.refused}); the admin listener answers it with its status
(L{fleetd.admin.refusals}).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from fleetd.inventory.model import (
    REFUSED_CLASSES,
    Device,
    DeviceStatus,
    IInventory,
    InventoryError,
)
from fleetd.k8s.client import KubeError
from fleetd.refused import (
    BUSY,
    CLASS_REFUSED,
    CONFLICT,
    DECOMMISSIONING,
    NOT_FOUND,
    SERIAL_AMBIGUOUS,
    STALE,
    TEMPLATE,
    UNAVAILABLE,
    Refused,
)
from fleetd.runs.provision import (
    Decommissioning,
    ICredentials,
    NotReady,
    Provisioned,
    RunMoved,
)
from fleetd.runs.registry import RunRegistry
from fleetd.runs.render import NodeFacts, RenderError, TemplateRenderer
from fleetd.store.fields import MAX_STRING
from fleetd.store.journal import AsyncJournal
from fleetd.tinkerbell.service import Refusal, TinkerbellService
from fleetd.vault import VaultError


class _TemplateFailed(Exception):
    """C{device}'s template could not be rendered (C{error} says why)."""

    def __init__(self, device: Device, cluster: str, error: RenderError) -> None:
        super().__init__(str(error))
        self.device = device
        self.cluster = cluster


def _busy(error: InventoryError) -> Refused:
    """NetBox cannot be asked: busy, with why (the token, when it is refused)."""
    return Refused(BUSY, f"{error}; nothing was provisioned")


class Provisioner:
    """
    The owner's provision, free of HTTP: every check and refusal of
    C{POST /v1/admin/provision} (L{fleetd.admin.provision}), for the owner
    API and the console's device page alike.
    """

    def __init__(
        self,
        registry: RunRegistry,
        inventory: IInventory,
        renderer: TemplateRenderer,
        journal: AsyncJournal,
        credentials: ICredentials | None = None,
        objects: TinkerbellService | None = None,
    ) -> None:
        """
        @param objects: with C{[tinkerbell]}, each device's Hardware and
            its run's Workflow (checked before any run is made, recorded
            with the runs, made after; the answer waits for their first
            try and tells it).
        """
        self._credentials = credentials
        self._objects = objects
        self._registry = registry
        self._inventory = inventory
        self._renderer = renderer
        self._journal = journal

    async def provision(
        self,
        names: list[str],
        actor: str,
        desiredAction: str | None = None,
        via: str | None = None,
        supersedes: Mapping[str, str | None] | None = None,
    ) -> list[Provisioned]:
        """
        Start one run per device of C{names} (checked names, as
        L{fleetd.admin.provision.parseProvision} gives them), all or none.

        @param via: where the owner asked (C{console}), journaled when given.
        @param supersedes: per device, the run id its latest run must be
            (L{None}: it has none), compared in the transaction that starts
            the runs: a confirmation submitted twice starts one run, and
            the second is refused (C{stale}) with nothing changed.
        @raise Refused: the one line saying why nothing was provisioned
            (store failures raise the store's own errors).
        """
        devices: list[Device] = []
        for name in names:
            try:
                device = await self._inventory.get(name)
                if device is not None:
                    await self._serialIsOne(device, actor)
            except InventoryError as e:
                if e.kind != "unavailable":
                    raise
                raise _busy(e) from e
            if device is None:
                raise Refused(NOT_FOUND, f"unknown device {name}")
            if device.status is DeviceStatus.DECOMMISSIONING:
                raise await self._decommissioning(name, actor)
            if device.device_class in REFUSED_CLASSES:
                await self._journal.append(
                    "provision.refused",
                    actor=actor,
                    device=name,
                    fields={"reason": "class-refused", "class": device.device_class},
                )
                raise Refused(
                    CLASS_REFUSED,
                    f"{name} is of class {device.device_class},"
                    " which cannot install through fleetd",
                )
            devices.append(device)
        for device in devices:  # before any token, file or run is made
            try:
                self._renderer.check(device.cluster, device.device_class)
            except RenderError as e:
                cluster = device.cluster or self._renderer.defaultCluster
                failed = _TemplateFailed(device, cluster, e)
                raise await self._templateFailed(failed, actor) from e
        if self._objects is not None:
            await self._preflight(self._objects, devices, actor)
        try:
            started = await self._provisionRuns(
                devices, desiredAction, actor, via, supersedes
            )
        except RunMoved as e:
            raise Refused(STALE, f"{e}: confirm again; nothing was provisioned") from e
        except NotReady as e:
            raise Refused(UNAVAILABLE, str(e)) from e
        except Decommissioning as e:  # retired while this request ran [R1]
            raise await self._decommissioning(e.device, actor) from e
        except _TemplateFailed as e:  # rendered once each, before any run is stored
            raise await self._templateFailed(e, actor) from e
        except VaultError as e:
            raise Refused(UNAVAILABLE, f"vault: {e}; nothing was provisioned") from e
        except KubeError as e:  # the bootstrap token's Secret [K1]
            raise Refused(
                UNAVAILABLE,
                f"kubernetes: {e}; nothing was provisioned",
            ) from e
        if self._objects is None:
            return started
        # The runs stand; their objects' calls are retried until made.
        await self._objects.settled([p.device for p in started])
        return [replace(p, objects=self._objects.view(p.device)) for p in started]

    async def _preflight(
        self, objects: TinkerbellService, devices: list[Device], actor: str
    ) -> None:
        """
        Tinkerbell's objects can be fleetd's (issue 28): no Hardware or
        live Workflow fleetd did not make stands in the way; else the
        refusal names it, journaled, and nothing is provisioned.
        """
        try:
            await objects.preflight(devices)
        except Refusal as e:
            if e.busy:
                raise Refused(UNAVAILABLE, f"{e}; nothing was provisioned") from e
            await self._journal.append(
                "provision.refused",
                actor=actor,
                device=e.device,
                fields={"reason": e.reason, "problem": str(e)[:MAX_STRING]},
            )
            raise Refused(CONFLICT, f"{e}; nothing was provisioned") from e

    async def _serialIsOne(self, device: Device, actor: str) -> None:
        """
        design.md, NetBox: C{device}'s serial names it alone (compared without regard
        to case, as NetBox's C{?serial=}); several devices are refused,
        journaled, before anything changes (issue 17 item 12).
        """
        try:
            found = await self._inventory.bySerial(device.serial)
            if found is not None and found.name == device.name:
                return
            line = (
                f"serial {device.serial} of {device.name}"
                " now finds another device; nothing was provisioned"
            )
        except InventoryError as e:
            if e.kind != "duplicate":
                raise
            line = f"{e}; nothing was provisioned"
        await self._journal.append(
            "provision.refused",
            actor=actor,
            device=device.name,
            fields={"reason": "serial-ambiguous", "serial": device.serial},
        )
        raise Refused(SERIAL_AMBIGUOUS, line)

    async def _templateFailed(self, failed: _TemplateFailed, actor: str) -> Refused:
        """The refusal of a provision whose template failed, journaled."""
        name = failed.device.name
        await self._journal.append(
            "provision.refused",
            actor=actor,
            device=name,
            fields={
                "reason": "template",
                "cluster": failed.cluster,
                "problem": str(failed)[:MAX_STRING],
            },
        )
        return Refused(
            TEMPLATE,
            f"{name} (cluster {failed.cluster}): {failed}; nothing was provisioned",
        )

    async def _decommissioning(self, name: str, actor: str) -> Refused:
        await self._journal.append(
            "provision.refused",
            actor=actor,
            device=name,
            fields={"reason": "decommissioning"},
        )
        return Refused(
            DECOMMISSIONING,
            f"{name} is retired and cannot be provisioned",
        )

    async def _provisionRuns(
        self,
        rendered: list[Device],
        action: str | None,
        actor: str,
        via: str | None,
        supersedes: Mapping[str, str | None] | None,
    ) -> list[Provisioned]:
        renderer = self._renderer

        def render(device: Device, run: str, token: str | None = None) -> bytes:
            facts = NodeFacts(
                device.name, device.device_class, run=run, bootstrap_token=token
            )
            try:
                return renderer.render(device.cluster, facts)
            except RenderError as e:
                cluster = device.cluster or renderer.defaultCluster
                raise _TemplateFailed(device, cluster, e) from e

        return await self._registry.provision(
            rendered,
            actor=actor,
            desiredAction=action,
            render=render,
            credentials=self._credentials,
            via=via,
            supersedes=supersedes,
            objects=self._objects,
        )
