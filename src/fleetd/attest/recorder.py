"""
How a refusal of the device listener's attestation side is recorded: counted
(L{AttestResults}), logged (throttled), and journaled as C{attest.refused}
with its reason, throttled (L{JournalThrottle}) [J1]. A refusal changes
nothing else, so its entry is its only record.

The entry names the device an approved binding (or the node's LDevID)
names; else, the device the node's claim maps to (L{fleetd.attest.naming},
issue 27), with C{named_by} saying how.
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.attest.naming import Claim, KnownDevices
from fleetd.attest.results import AttestResults
from fleetd.attest.throttle import JournalThrottle
from fleetd.logs import ThrottledLog
from fleetd.nodes import Refused
from fleetd.store.journal import AsyncJournal

ACTOR = "attest"


class RefusalRecorder:
    """Counts, logs and journals refusals (see the module docstring)."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        journal: AsyncJournal,
        results: AttestResults,
        known: KnownDevices | None = None,
    ) -> None:
        """@param known: the devices a claim may name (L{None}: none)."""
        self._journal = journal
        self._results = results
        self._known = known
        self._throttle = JournalThrottle(clock)
        # Anyone can reach 8444: refusal lines in the log are throttled too.
        self._log = ThrottledLog(clock, self.log)

    def _named(
        self, device: str | None, reason: str, claim: Claim | None
    ) -> tuple[str | None, dict[str, str | int | None]] | None:
        """
        The device to journal C{reason} under and the fields that say how
        (and how many were not journaled), or L{None}: only counted.
        """
        if device is None and claim is not None and self._known is not None:
            found = claim.device(self._known)
            if found is not None:
                claimed = self._throttle.admitClaimed(found[0], reason)
                if claimed is None:
                    return None
                named, skippedClaimed = claimed
                how: dict[str, str | int | None] = {}
                if named is not None:
                    how["named_by"] = found[1]
                if skippedClaimed:
                    how["not_journaled"] = skippedClaimed
                return named, how
        skipped = self._throttle.admit(device, reason)
        if skipped is None:
            return None
        return device, ({"not_journaled": skipped} if skipped else {})

    async def refuse(
        self,
        refusal: Refused,
        *,
        device: str | None = None,
        claim: Claim | None = None,
        fields: Mapping[str, str | None] | None = None,
    ) -> Refused:
        """
        Record C{refusal} about C{device} (or, when L{None}, the device
        C{claim} maps to), with C{fields} of its own, and return it.
        """
        self._results.refused(refusal.reason)
        self._log.warn(
            "attest.refused {reason} {device}", reason=refusal.reason, device=device
        )
        named = self._named(device, refusal.reason, claim)
        if named is None:
            return refusal
        try:
            await self._journal.append(
                "attest.refused",
                actor=ACTOR,
                device=named[0],
                fields={
                    "reason": refusal.reason,
                    "detail": refusal.detail[:200],
                    **(fields or {}),
                    **named[1],
                },
            )
        except Exception as e:
            # The refusal stands; the operator learns the journal is failing.
            self.log.error(
                "attest.journal-failed {reason} {error}",
                reason=refusal.reason,
                error=str(e)[:200],
            )
        return refusal
