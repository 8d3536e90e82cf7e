"""
The owner's side of the device flow: approving and denying requests.

A decision takes the request out of other hands (C{decide}), is checked,
is journaled, and only then changes what the node's next poll gets [J1]:
when the journal refuses the entry, the request is pending again, the
node keeps hearing C{authorization_pending}, and the owner gets one line.

An approval names an inventory device. The uuid and serial the node
reported must be that device's (uuids in lower case, serials without
regard to case). When they differ, the owner may approve anyway only by
naming exactly what differs (C{acceptMismatch}, C{fleetctl approve
--force}): the server still compares, refuses when the difference is not
the one the owner accepted, and journals the approval with C{forced=true}
and what differed (RFC 8628 section 5.4, remote phishing). A device-flow
approval lets a node fetch its device's ready run; it never approves an
EK binding [T1].
"""

from __future__ import annotations

from collections.abc import Collection

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.deviceflow.machine import Held, Outcome
from fleetd.deviceflow.model import (
    COMPARED,
    DeviceFlowError,
    Grant,
    IRunLookup,
    RequestView,
    differences,
    normaliseUserCode,
)
from fleetd.ratelimit import RateLimiter
from fleetd.store.fields import FieldValue
from fleetd.store.journal import AsyncJournal


def _reported(value: str) -> str:
    """A node-reported value the journal's secret guard will take."""
    return "(refused: PEM marker)" if "-----BEGIN" in value else value


class Decisions:
    """
    Approvals and denials of held requests (a base of
    L{fleetd.deviceflow.flow.DeviceFlow}).

    Failed attempts (unknown user codes) spend from a small budget per
    owner and overall (RFC 8628 section 5.1: about 5 guesses per code
    lifetime); once it is spent every decision is refused for a while.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        runs: IRunLookup,
        journal: AsyncJournal,
        expiresIn: int,
    ) -> None:
        self._clock = clock
        self._runs = runs
        self._journal = journal
        self._approveLimiter = RateLimiter(
            clock,
            rate=5 / expiresIn,
            burst=5,
            globalRate=10 / expiresIn,
            globalBurst=10,
            maxSources=64,
        )

    def sweep(self) -> None:
        raise NotImplementedError

    def _held(self, letters: str) -> Held | None:
        raise NotImplementedError

    async def approve(
        self,
        userCode: str,
        device: str,
        owner: str,
        acceptMismatch: Collection[str] = (),
    ) -> RequestView:
        """
        Let the request C{userCode} fetch C{device}'s ready run, once
        journaled; C{acceptMismatch} names the fields (C{uuid}, C{serial})
        the owner knowingly approves despite their differing.

        @raise DeviceFlowError: see L{DeviceFlowError.kind}.
        """
        held = self._decidable(userCode, owner)
        try:
            grant, fields = self._approval(held, device, frozenset(acceptMismatch))
        except DeviceFlowError:
            held.machine.undecided()
            raise
        await self._record(held, "deviceflow.approved", owner, device, fields)
        held.machine.approved(grant)
        held.device, held.decided_by = device, owner
        if await self._expiredMeanwhile(held, owner):
            raise DeviceFlowError(
                "expired",
                f"request {held.id} expired while the approval was recorded;"
                " the node must start the device flow again",
            )
        self.log.info(
            "deviceflow.approved {request} {device} {owner} forced={forced}",
            request=held.id,
            device=device,
            owner=owner,
            forced=bool(fields.get("forced")),
        )
        return held.view()

    async def deny(
        self, userCode: str, owner: str, via: str | None = None
    ) -> RequestView:
        """
        Refuse the request C{userCode}, once journaled; its node stops.

        @param via: where the owner decided (C{console}), journaled when given.
        """
        held = self._decidable(userCode, owner)
        fields: dict[str, FieldValue] = {} if via is None else {"via": via}
        await self._record(held, "deviceflow.denied", owner, None, fields)
        held.machine.denied()
        held.decided_by = owner
        await self._expiredMeanwhile(held, owner)
        self.log.info(
            "deviceflow.denied {request} {owner}", request=held.id, owner=owner
        )
        return held.view()

    async def _expiredMeanwhile(self, held: Held, owner: str) -> bool:
        """
        The request's lifetime ended while its decision was being recorded
        (the sweep passed it by while it was C{deciding}): expire it now, so
        no token is ever issued for it, and say so in the journal.
        """
        if self._clock.seconds() < held.expires_at:
            return False
        held.machine.expire()
        try:
            await self._journal.append(
                "deviceflow.expired",
                actor="fleetd",
                device=held.device,
                fields={"request": held.id, "after": "decision"},
            )
        except Exception as e:  # the request is expired either way
            self.log.error(
                "deviceflow.expiry-not-recorded {request} {reason}",
                request=held.id,
                reason=str(e)[:200],
            )
        return True

    def _approval(
        self, held: Held, device: str, accept: frozenset[str]
    ) -> tuple[Grant, dict[str, FieldValue]]:
        """The grant and journal fields of approving C{held} as C{device}."""
        if not (0 < len(device) <= 128 and device.isprintable()):
            raise DeviceFlowError("invalid", "device: not a device name")
        if not accept <= set(COMPARED):
            raise DeviceFlowError("invalid", "accept_mismatch: only uuid and serial")
        known = self._runs.identity(device)
        if known is None:
            raise DeviceFlowError(
                "unknown-device", f"no uuid/serial known for {device}"
            )
        reported = held.reported
        differ = differences(reported, known)
        if set(differ) != accept:
            if not differ:
                line = f"the request is {device}'s: approve it without --force"
            else:
                line = (
                    f"the request reported another {' and '.join(differ)} than"
                    f" {device} (unreported counts as different);"
                    " check the machine, then --force"
                )
            raise DeviceFlowError("mismatch", line)
        if self._runs.readyRun(device) is None:
            message = f"{device} has no ready run: provision {device} first"
            raise DeviceFlowError("no-ready-run", message)
        fields: dict[str, FieldValue] = {}
        for name in COMPARED:
            if name in reported:
                fields[name] = _reported(reported[name])
        if differ:
            fields["forced"] = True
            fields["mismatch"] = ",".join(differ)
            fields["inventory_uuid"], fields["inventory_serial"] = known
        if held.known is not None and held.known != device:
            fields["reported_device"] = held.known
        grant = Grant(
            device=device,
            uuid=reported.get("uuid"),
            serial=reported.get("serial"),
            inventory=known,
        )
        return grant, fields

    async def _record(
        self,
        held: Held,
        event: str,
        owner: str,
        device: str | None,
        fields: dict[str, FieldValue],
    ) -> None:
        """Journal a decision; when the journal refuses, nothing changes."""
        try:
            await self._journal.append(
                event,
                actor=f"owner:{owner}",
                device=device,
                fields={"request": held.id, "peer": held.peer, **fields},
            )
        except Exception as e:
            held.machine.undecided()
            if self._clock.seconds() >= held.expires_at:
                held.machine.expire()  # the sweep passed it by while deciding
            self.log.error(
                "deviceflow.decision-not-recorded {request} {reason}",
                request=held.id,
                reason=str(e)[:200],
            )
            raise DeviceFlowError(
                "not-recorded",
                "the journal did not take the decision; nothing changed, try again",
            ) from None

    def _decidable(self, userCode: str, owner: str) -> Held:
        """The request C{userCode} names, now being decided by C{owner}."""
        self.sweep()
        budget = self._approveLimiter
        if not budget.peek(owner):
            wait = budget.retryAfter(owner)
            message = f"too many unknown user codes: try again in {wait} s"
            raise DeviceFlowError("too-many-attempts", message)
        letters = normaliseUserCode(userCode)
        held = None if letters is None else self._held(letters)
        if held is None:
            budget.allow(owner)
            raise DeviceFlowError("unknown-user-code", "no such user code")
        outcome = held.machine.decide()
        if outcome is Outcome.DECIDE:
            return held
        if outcome is Outcome.EXPIRED:
            raise DeviceFlowError("expired", f"request {held.id} has expired")
        if outcome is Outcome.BUSY:
            message = f"request {held.id} is being decided by another owner"
            raise DeviceFlowError("being-decided", message)
        state = held.machine.status()
        raise DeviceFlowError(
            "already-decided", f"request {held.id} is already {state}"
        )
