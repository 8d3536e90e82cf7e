"""
The OAuth 2.0 device authorization grant (RFC 8628) for Talos's
C{talos.config.oauth.*} client, on an injected clock.

A node in Talos POSTs C{/device/code} (with C{uuid}, C{serial}, C{mac},
C{hostname} and C{code} as extra form fields when configured), prints the
user code and C{verification_uri} (the admin listener's C{/device} page
[F3]) with a QR code of C{verification_uri_complete} (that page with the
user code filled in) and polls C{/token}; the owner approves on that page
or runs C{fleetctl approve USER-CODE --device NAME}; the next poll gets
an access token, and C{GET /config} with C{Authorization: Bearer} is
authorized by L{DeviceFlow.authorize}.

Secrets: device codes and access tokens are 256-bit random strings held
only as SHA-256 digests; user codes are short and guessable, so they are
secrets too. None of them, nor the C{code} a node reports, appears in a log
line, a journal entry or an error message; a request is named by its
public id (L{RequestView.id}) instead.

Each request's life is a L{fleetd.deviceflow.machine} machine; every
decision and every token is journaled before the node can see it [J1].

[F1] C{/token} answers only RFC 8628's errors, never 429: polls faster
than the interval get C{slow_down} (L{PollPacer}, which lets
golang.org/x/oauth2's back-to-back probe pairs through). Device codes
cannot be guessed, so unknown ones cost nothing but a 400.

[F2] A token is bound to the approved device and to the uuid and serial
its node reported, and authorizes one delivery of whatever run of that
device is ready when the node asks, for C{tokenExpiresIn} (3 h: Talos
reuses it through its download retries), so a provision after the approval
does not strand the node.

[F4] Nothing a successful C{/device/code} spends is shared: live requests
are capped per source (an IPv6 /64 is one source) and held in two pools.
Requests whose reported uuid and serial are an inventory device's have
C{maxPerDevice} slots of that device's own; all others (strangers) share
C{maxStrangers} slots. A flood from any number of addresses fills only the
strangers' pool, so it cannot lock out a node that reports its own
identity (only someone who reports that very uuid and serial can contend
its slots, and the owner sees each request's source before approving).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from urllib.parse import urlencode

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.deviceflow.machine import (
    Held,
    Outcome,
    RequestCore,
    RequestMachine,
)
from fleetd.deviceflow.model import (
    ALPHABET,
    GRANT_TYPE,
    MAX_VALUE,
    REPORTED,
    USER_CODE_LENGTH,
    DeviceFlowError,
    Grant,
    IRunLookup,
    RequestView,
    displayUserCode,
)
from fleetd.deviceflow.owner import Decisions
from fleetd.sources import sourceKey
from fleetd.store.journal import AsyncJournal

__all__ = ["GRANT_TYPE", "DeviceFlow", "DeviceFlowError", "Grant", "Reply"]


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def _value(form: Mapping[str, str], name: str) -> str | None:
    """A form value, or L{None} if absent; raise if too long or unprintable."""
    value = form.get(name)
    if value is not None and (len(value) > MAX_VALUE or not value.isprintable()):
        raise ValueError(f"{name} must be at most {MAX_VALUE} printable characters")
    return value


@dataclass(frozen=True)
class Reply:
    """An answer of the boot endpoints: status, JSON, maybe C{Retry-After}."""

    status: int
    document: dict[str, object]
    retryAfter: int | None = None


def _error(error: str, description: str | None = None) -> Reply:
    document: dict[str, object] = {"error": error}
    if description is not None:
        document["error_description"] = description
    return Reply(400, document)


class DeviceFlow(Decisions):
    """
    Device authorization requests, their decisions and access tokens.

    @param verificationURI: what the node's console tells the owner to
        visit [F3]; C{verification_uri_complete} is it with
        C{?user_code=XXXX-XXXX} (RFC 8628 section 3.3.1), which the page
        looks up (spending the failed-attempt budget like a decision).
    @param expiresIn: seconds a request lives (device and user code).
    @param interval: the polling interval first asked for, in seconds.
    @param tokenExpiresIn: seconds an access token authorizes C{/config}.
    @param maxPerSource: live requests one source may hold.
    @param maxPerDevice: live requests that report one inventory device's
        uuid and serial.
    @param maxStrangers: live requests that report no inventory identity.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        runs: IRunLookup,
        journal: AsyncJournal,
        *,
        verificationURI: str,
        expiresIn: int = 600,
        interval: int = 5,
        tokenExpiresIn: int = 3 * 3600,
        maxPerSource: int = 2,
        maxPerDevice: int = 2,
        maxStrangers: int = 256,
    ) -> None:
        numbers = (expiresIn, interval, tokenExpiresIn, maxPerSource, maxPerDevice)
        if min(*numbers, maxStrangers) < 1:
            raise ValueError("every lifetime, interval and limit must be >= 1")
        super().__init__(clock, runs, journal, expiresIn)
        self.verificationURI = verificationURI
        self.expiresIn = expiresIn
        self.interval = interval
        self.tokenExpiresIn = tokenExpiresIn
        self.maxPerSource = maxPerSource
        self.maxPerDevice = maxPerDevice
        self.maxStrangers = maxStrangers
        self._requests: OrderedDict[bytes, Held] = OrderedDict()
        self._byUser: dict[str, Held] = {}
        # Live (not yet expired) requests, oldest first, per pool.
        self._live: deque[Held] = deque()
        self._bySource: dict[str, deque[Held]] = {}
        self._byDevice: dict[str, deque[Held]] = {}
        self._strangers: deque[Held] = deque()
        self._tokens: OrderedDict[bytes, tuple[Grant, float]] = OrderedDict()

    # The node's side

    def requestCode(self, form: Mapping[str, str], peer: str) -> Reply:
        """C{POST /device/code}: start a request (RFC 8628 section 3.1)."""
        self.sweep()
        now = self._clock.seconds()
        try:
            clientID = _value(form, "client_id")
            for unused in ("scope", "audience"):  # checked, then ignored
                _value(form, unused)
            reported = {n: v for n in REPORTED if (v := _value(form, n)) is not None}
        except ValueError as e:
            return _error("invalid_request", str(e))
        if clientID is None:
            return _error("invalid_request", "client_id is required")
        source = sourceKey(peer)
        known = None
        if "uuid" in reported and "serial" in reported:
            known = self._runs.deviceByIdentity(reported["uuid"], reported["serial"])
        refusal = self._admit(source, known, now)
        if refusal is not None:
            return refusal
        deviceCode = secrets.token_urlsafe(32)
        letters = self._newUserCode()
        userCode = displayUserCode(letters)
        core = RequestCore(self.interval)
        held = Held(
            digest=_digest(deviceCode),
            letters=letters,
            id="dfr-" + secrets.token_hex(6),
            reported=MappingProxyType(reported),
            peer=peer,
            source=source,
            client_id=clientID,
            created_at=now,
            expires_at=now + self.expiresIn,
            known=known,
            machine=RequestMachine(core),
            core=core,
        )
        self._requests[held.digest] = self._byUser[letters] = held
        self._live.append(held)
        self._bySource.setdefault(source, deque()).append(held)
        pool = self._strangers if known is None else self._pool(known)
        pool.append(held)
        self.log.info(
            "deviceflow.requested {request} {peer} known={known}",
            request=held.id,
            peer=peer,
            known=known,
        )
        return Reply(
            200,
            {
                "device_code": deviceCode,
                "user_code": userCode,
                "verification_uri": self.verificationURI,
                "verification_uri_complete": (
                    f"{self.verificationURI}?{urlencode({'user_code': userCode})}"
                ),
                "expires_in": self.expiresIn,
                "interval": self.interval,
            },
        )

    def _pool(self, device: str) -> deque[Held]:
        return self._byDevice.setdefault(device, deque())

    def _admit(self, source: str, known: str | None, now: float) -> Reply | None:
        """The refusal of one more live request from C{source}, if any [F4]."""
        mine = self._bySource.get(source, ())
        if len(mine) >= self.maxPerSource:
            return self._full(429, "rate_limited", "too many requests from here", mine)
        if known is not None:
            theirs = self._byDevice.get(known, ())
            if len(theirs) >= self.maxPerDevice:
                line = "too many requests for this machine"
                return self._full(429, "rate_limited", line, theirs)
        elif len(self._strangers) >= self.maxStrangers:
            line = "too many requests from unknown machines"
            return self._full(503, "temporarily_unavailable", line, self._strangers)
        return None

    def _full(self, status: int, error: str, line: str, held: object) -> Reply:
        oldest = next(iter(held))  # type: ignore[call-overload]
        wait = max(1, math.ceil(oldest.expires_at - self._clock.seconds()))
        return Reply(status, {"error": error, "error_description": line}, wait)

    async def poll(self, form: Mapping[str, str], peer: str) -> Reply:
        """C{POST /token}: the device access token request (section 3.4) [F1]."""
        self.sweep()
        try:
            grantType = _value(form, "grant_type")
            deviceCode = _value(form, "device_code")
            clientID = _value(form, "client_id")
        except ValueError as e:
            return _error("invalid_request", str(e))
        if grantType is None:
            return _error("invalid_request", "grant_type is required")
        if grantType != GRANT_TYPE:
            return _error("unsupported_grant_type")
        if deviceCode is None or clientID is None:
            return _error("invalid_request", "device_code and client_id are required")
        held = self._requests.get(_digest(deviceCode))
        if held is None or held.client_id != clientID:
            return _error("invalid_grant")
        outcome = held.machine.poll(self._clock.seconds())
        if outcome is Outcome.ISSUE:
            return await self._issue(held, peer)
        if outcome is Outcome.SPENT:
            return _error("invalid_grant", "the token was already issued")
        return _error(outcome.value)

    async def _issue(self, held: Held, peer: str) -> Reply:
        """Journal the token, then hand it out [J1]."""
        grant = held.core.grant
        assert grant is not None
        try:
            await self._journal.append(
                "deviceflow.issued",
                actor=f"node:{grant.device}",
                device=grant.device,
                fields={"request": held.id, "peer": peer},
            )
        except Exception as e:
            held.machine.notIssued()
            self.log.error(
                "deviceflow.issue-not-recorded {request} {reason}",
                request=held.id,
                reason=str(e)[:200],
            )
            return _error("authorization_pending")
        token = secrets.token_urlsafe(32)
        expires = self._clock.seconds() + self.tokenExpiresIn
        self._tokens[_digest(token)] = (grant, expires)
        held.machine.issued()
        self.log.info(
            "deviceflow.issued {request} {device} {peer}",
            request=held.id,
            device=grant.device,
            peer=peer,
        )
        return Reply(
            200,
            {
                "access_token": token,
                "token_type": "Bearer",
                "expires_in": self.tokenExpiresIn,
            },
        )

    def authorize(self, accessToken: str) -> Grant | None:
        """What C{accessToken} (from C{Authorization: Bearer}) allows, if any."""
        self.sweep()
        if not 0 < len(accessToken) <= MAX_VALUE:
            return None
        key = _digest(accessToken)
        found = self._tokens.get(key)
        if found is None or self._clock.seconds() >= found[1]:
            return None
        return replace(found[0], key=key)

    def delivered(self, grant: Grant, run: str) -> None:
        """C{grant}'s token delivered C{run}: it authorizes nothing more [F2]."""
        found = self._tokens.get(grant.key)
        if found is not None:
            self._tokens[grant.key] = (replace(found[0], delivered=run), found[1])

    # The owner's side (approve and deny are in Decisions)

    def pending(self) -> list[RequestView]:
        """Undecided, unexpired requests, oldest first."""
        self.sweep()
        return [h.view() for h in self._live if h.machine.awaitsDecision()]

    def _held(self, letters: str) -> Held | None:
        return self._byUser.get(letters)

    def sweep(self) -> None:
        """
        Expire requests whose lifetime is over, forget them one lifetime
        later (until then a poll hears C{expired_token}), and drop expired
        tokens. All requests (and tokens) live equally long, so the oldest
        are first in every queue.
        """
        now = self._clock.seconds()
        while self._live and now >= self._live[0].expires_at:
            held = self._live.popleft()
            self._unqueue(held)
            held.machine.expire()
        while self._requests:
            oldest = next(iter(self._requests.values()))
            if now < oldest.expires_at + self.expiresIn:
                break
            del self._requests[oldest.digest]
            del self._byUser[oldest.letters]
        while self._tokens and now >= next(iter(self._tokens.values()))[1]:
            self._tokens.popitem(last=False)

    def _unqueue(self, held: Held) -> None:
        """Take the oldest live request C{held} out of its pools."""
        mine = self._bySource[held.source]
        mine.popleft()
        if not mine:
            del self._bySource[held.source]
        if held.known is None:
            self._strangers.popleft()
            return
        theirs = self._byDevice[held.known]
        theirs.popleft()
        if not theirs:
            del self._byDevice[held.known]

    def _newUserCode(self) -> str:
        while True:  # 20**8 codes against the few held ones
            letters = "".join(secrets.choice(ALPHABET) for _ in range(USER_CODE_LENGTH))
            if letters not in self._byUser:
                return letters
