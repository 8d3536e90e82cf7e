"""
L{TrustService}: evidence and EK bindings for owners [T1], free of HTTP.

Every change and its journal entries commit in one transaction [J1]
(L{AsyncJournal.change}); so does the journal entry of a refused
approval, which changes nothing else. Failures are L{TrustError}s, or the
store's own errors (the admin API turns those into one line saying that
nothing changed).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.inventory.model import IInventory
from fleetd.store.db import Database
from fleetd.store.fields import FieldValue
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner
from fleetd.trust import bindings
from fleetd.trust.model import (
    BindingView,
    EvidenceInput,
    EvidenceRecord,
    TrustError,
    validateEKDigest,
    validateRef,
    validateTrustSerial,
)

_INSERT = (
    "INSERT INTO evidence (serial, ek_sha256, kind, ref, recorded_at, recorded_by)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)


@dataclass(frozen=True)
class Recorded:
    """The outcome of recording evidence: new rows, repeats and conflicts."""

    recorded: list[EvidenceRecord] = field(default_factory=list)
    unchanged: list[EvidenceRecord] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    def toJSON(self) -> dict[str, Any]:
        return {
            "recorded": [r.toJSON() for r in self.recorded],
            "unchanged": [r.toJSON() for r in self.unchanged],
            "conflicts": list(self.conflicts),
        }


@dataclass(frozen=True)
class Approval:
    """An approved binding; C{changed} is False when it was already so."""

    binding: BindingView
    changed: bool
    replaced: list[tuple[str, str]]

    def toJSON(self) -> dict[str, Any]:
        return {
            **self.binding.toJSON(),
            "changed": self.changed,
            "replaced": [{"serial": s, "ek_sha256": e} for s, e in self.replaced],
        }


@dataclass(frozen=True)
class TrustState:
    """What C{fleetctl status} shows about one serial."""

    binding: BindingView | None
    evidence: list[EvidenceRecord]

    def toJSON(self) -> dict[str, Any]:
        return {
            "binding": None if self.binding is None else self.binding.toJSON(),
            "evidence": [r.toJSON() for r in self.evidence],
        }


def _existing(conn: sqlite3.Connection, claim: EvidenceInput) -> EvidenceRecord | None:
    for record in bindings.evidenceFor(conn, serial=claim.serial, ek=claim.ek_sha256):
        if record.kind is claim.kind and record.ref == claim.ref:
            return record
    return None


class TrustService:
    """Evidence, withdrawals and approvals, each journaled with its change."""

    log = Logger()

    def __init__(
        self,
        runner: IRunner,
        journal: AsyncJournal,
        inventory: IInventory,
        clock: IReactorTime,
    ) -> None:
        self._runner = runner
        self._journal = journal
        self._inventory = inventory
        self._clock = clock

    async def _devices(self) -> dict[str, str]:
        """Inventory serials (lowercased) to device names."""
        return {d.serial.lower(): d.name for d in await self._inventory.list()}

    async def record(
        self, claims: Sequence[EvidenceInput], *, actor: str, via: str
    ) -> Recorded:
        """
        Record claims all together or none; a claim already recorded (same
        serial, EK, kind and ref, not withdrawn) is left as it is. Each new
        claim that conflicts with live evidence is journaled as
        C{evidence.conflict} beside its C{evidence.recorded}.
        """
        devices = await self._devices()
        at = self._clock.seconds()

        def work(db: Database, record: Recorder) -> Recorded:
            conn = db.connection
            result = Recorded()
            for claim in claims:
                old = _existing(conn, claim)
                if old is not None:
                    result.unchanged.append(old)
                    continue
                cursor = conn.execute(
                    _INSERT,
                    (claim.serial, claim.ek_sha256, claim.kind.value, claim.ref, at,
                     actor),
                )  # fmt: skip
                new = bindings.evidenceById(conn, int(cursor.lastrowid or 0))
                assert new is not None
                result.recorded.append(new)
                device = devices.get(claim.serial.lower())
                fields: dict[str, FieldValue] = {
                    "evidence": new.id,
                    "serial": claim.serial,
                    "ek_sha256": claim.ek_sha256,
                    "kind": claim.kind.value,
                    "ref": claim.ref,
                    "via": via,
                }
                record("evidence.recorded", actor=actor, device=device, fields=fields)
                conflict = bindings.conflictOf(conn, claim.serial, claim.ek_sha256)
                if conflict:
                    result.conflicts.append(conflict.describe())
                    record(
                        "evidence.conflict",
                        actor=actor,
                        device=device,
                        fields={
                            "evidence": new.id,
                            "serial": claim.serial,
                            "ek_sha256": claim.ek_sha256,
                            "conflict": conflict.describe()[:500],
                        },
                    )
            return result

        done = await self._journal.change(work)
        for line in done.conflicts:
            self.log.warn("trust.evidence.conflict {conflict}", conflict=line)
        return done

    async def withdraw(
        self, evidenceId: int, *, actor: str, reason: object
    ) -> EvidenceRecord:
        """Withdraw one piece of evidence (it stays listed, marked withdrawn)."""
        why = validateRef(reason)
        if why is None:
            raise TrustError("reason: say why the evidence is withdrawn")
        devices = await self._devices()
        at = self._clock.seconds()

        def work(db: Database, record: Recorder) -> EvidenceRecord:
            conn = db.connection
            old = bindings.evidenceById(conn, evidenceId)
            if old is None:
                raise TrustError(f"no evidence {evidenceId}", "not-found")
            if not old.live:
                raise TrustError(f"evidence {evidenceId} is already withdrawn")
            conn.execute(
                "UPDATE evidence SET withdrawn_at = ?, withdrawn_by = ?,"
                " withdrawn_reason = ? WHERE id = ?",
                (at, actor, why, evidenceId),
            )
            record(
                "evidence.withdrawn",
                actor=actor,
                device=devices.get(old.serial.lower()),
                fields={
                    "evidence": old.id,
                    "serial": old.serial,
                    "ek_sha256": old.ek_sha256,
                    "kind": old.kind.value,
                    "reason": why,
                },
            )
            new = bindings.evidenceById(conn, evidenceId)
            assert new is not None
            return new

        return await self._journal.change(work)

    async def approve(
        self, serial: object, *, actor: str, ek: object = None, via: str | None = None
    ) -> Approval:
        """
        Approve the binding of C{serial} [T1], or refuse with a
        L{TrustError} of kind C{"refused"} whose code and line say which
        evidence is missing or conflicts; the refusal is journaled
        (C{binding.refused}) and changes nothing else.

        @param via: where the owner asked (C{console}), journaled when given.
        """
        extra: dict[str, FieldValue] = {} if via is None else {"via": via}
        wanted = validateTrustSerial(serial)
        pinned = None if ek is None else validateEKDigest(ek)
        device = await self._inventoryDevice(wanted)
        at = self._clock.seconds()

        def work(db: Database, record: Recorder) -> Approval | TrustError:
            conn = db.connection
            decision = bindings.decide(conn, wanted, pinned)
            if device is None:
                decision = bindings.Decision(
                    code=bindings.NOT_IN_INVENTORY,
                    reason=f"no device in the inventory has serial {wanted};"
                    " add it (fleetctl device add) before approving its binding",
                )
            if decision.code is not None:
                record(
                    "binding.refused",
                    actor=actor,
                    device=None if device is None else device[0],
                    fields={
                        "serial": wanted,
                        "ek_sha256": pinned,
                        "reason": decision.code,
                        "detail": decision.reason[:500],
                        **extra,
                    },
                )
                return TrustError(decision.reason, "refused", decision.code)
            assert decision.ek is not None and decision.evidenceId is not None
            assert device is not None
            name, stored = device
            current = bindings.bindingForSerial(conn, stored)
            if (
                current is not None
                and current.ek_sha256 == decision.ek
                and current.state == "approved"
            ):
                return Approval(current, changed=False, replaced=[])
            replaced = bindings.storeBinding(
                conn,
                serial=stored,
                ek=decision.ek,
                device=name,
                evidenceId=decision.evidenceId,
                at=at,
                actor=actor,
            )
            fields: dict[str, FieldValue] = {
                "serial": stored,
                "ek_sha256": decision.ek,
                "evidence": decision.evidenceId,
                **extra,
            }
            if replaced:
                fields["replaced"] = ", ".join(f"{s}={e}" for s, e in replaced)[:500]
            record("binding.approved", actor=actor, device=name, fields=fields)
            view = bindings.bindingForSerial(conn, stored)
            assert view is not None
            return Approval(view, changed=True, replaced=replaced)

        outcome = await self._journal.change(work)
        if isinstance(outcome, TrustError):
            self.log.warn(
                "trust.binding.refused {serial} {code}",
                serial=wanted,
                code=outcome.code,
            )
            raise outcome
        return outcome

    async def decision(self, serial: str) -> bindings.Decision:
        """
        What L{approve} of C{serial} would decide from the evidence now
        (reads only; the console offers approval only when it would approve).
        """
        wanted = validateTrustSerial(serial)

        def read(db: Database) -> bindings.Decision:
            with db.transaction(write=False) as conn:
                return bindings.decide(conn, wanted, None)

        return await self._runner.run(read)

    async def _inventoryDevice(self, serial: str) -> tuple[str, str] | None:
        """The (name, serial as the inventory spells it) of C{serial}'s device."""
        device = await self._inventory.bySerial(serial)
        return None if device is None else (device.name, device.serial)

    async def evidence(self, serial: object = None) -> list[EvidenceRecord]:
        """Every piece of evidence (withdrawn too), or that naming C{serial}."""
        wanted = None if serial is None else validateTrustSerial(serial)

        def read(db: Database) -> list[EvidenceRecord]:
            with db.transaction(write=False) as conn:
                return bindings.evidenceFor(conn, serial=wanted, live=False)

        return await self._runner.run(read)

    async def bindings(self) -> list[BindingView]:
        """Every approved binding, with whether it holds now."""

        def read(db: Database) -> list[BindingView]:
            with db.transaction(write=False) as conn:
                return bindings.bindings(conn)

        return await self._runner.run(read)

    async def stateFor(self, serial: str) -> TrustState:
        """The binding and evidence of one serial (for C{fleetctl status})."""

        def read(db: Database) -> TrustState:
            with db.transaction(write=False) as conn:
                return TrustState(
                    bindings.bindingForSerial(conn, serial),
                    bindings.evidenceFor(conn, serial=serial, live=False),
                )

        return await self._runner.run(read)
