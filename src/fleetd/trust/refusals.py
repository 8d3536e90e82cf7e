"""
A device's standing refused attestation, as people see it (issue 27,
item 4): C{fleetctl status}, the console's device page and its fleet view.

The journal is the record, and nothing else is kept: a device's refusal
stands while its last entry among C{attest.refused} and C{ldevid.issued}
is a refusal; an LDevID issued since (an attestation or a renewal that
succeeded) clears it. So it survives a restart, and a refusal the journal
throttled (L{fleetd.attest.throttle}) is told by the one before it.

The step back is decided from the device's evidence as it stands now
(L{bindings.decide}), so a step the owner took since is not asked for
again; its words are L{fleetd.statuswords}'.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from fleetd.inventory.model import Device
from fleetd.statuswords import refusalStep
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal
from fleetd.store.runner import IRunner
from fleetd.trust import bindings

REFUSED = "attest.refused"
ISSUED = "ldevid.issued"
APPROVABLE = "approvable"
APPROVED = "approved"


def approvalOf(conn: sqlite3.Connection, serial: str) -> str:
    """
    What C{binding approve} of C{serial} would do now: the code of its
    refusal, L{APPROVABLE}, or L{APPROVED} when the binding it would
    approve holds already.
    """
    decision = bindings.decide(conn, serial, None)
    if decision.code is not None:
        return decision.code
    holding = bindings.bindingForSerial(conn, serial)
    if (
        holding is not None
        and holding.state == "approved"
        and holding.ek_sha256 == decision.ek
    ):
        return APPROVED
    return APPROVABLE


class AttestRefusals:
    """The standing refused attestations of devices, read when asked."""

    def __init__(self, runner: IRunner, journal: AsyncJournal) -> None:
        self._runner = runner
        self._journal = journal

    async def standing(self, devices: Sequence[Device]) -> dict[str, dict[str, Any]]:
        """
        By device name, each of C{devices}' standing refusal: C{reason},
        C{detail}, C{at}, C{seq}, C{named_by} (how the claim named it;
        L{None} for a binding or an LDevID) and C{step}. Devices without
        one are left out. Two trips to the database at most.
        """
        last = await self._journal.lastAmong(
            devices=[d.name for d in devices], events=(REFUSED, ISSUED)
        )
        refused = [
            d for d in devices if d.name in last and last[d.name].event == REFUSED
        ]
        if not refused:
            return {}
        trusting = [
            d.serial
            for d in refused
            if last[d.name].fields.get("reason") == bindings.REFUSAL_CODE
        ]

        def read(db: Database) -> dict[str, str]:
            with db.transaction(write=False) as conn:
                return {s: approvalOf(conn, s) for s in trusting}

        approvals = await self._runner.run(read) if trusting else {}
        found = {}
        for device in refused:
            entry = last[device.name]
            reason = str(entry.fields.get("reason", ""))
            detail, namedBy = entry.fields.get("detail"), entry.fields.get("named_by")
            found[device.name] = {
                "reason": reason,
                "detail": None if detail is None else str(detail),
                "at": entry.at,
                "seq": entry.seq,
                "named_by": None if namedBy is None else str(namedBy),
                "step": refusalStep(
                    reason, device.name, device.serial, approvals.get(device.serial)
                ),
            }
        return found
