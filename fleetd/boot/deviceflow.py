"""
The OAuth 2.0 device authorization grant (RFC 8628) for Talos's
C{talos.config.oauth.*} client, as pure state on an injected clock.

A node in Talos POSTs C{/device/code} (with C{uuid}, C{serial}, C{mac},
C{hostname} and C{code} as extra form fields when configured), prints the
user code on its console and polls C{/token}; the owner runs C{fleetctl
approve USER-CODE --device NAME}, which binds the request to that device's
ready run; the next poll gets an access token, and C{GET /config} with
C{Authorization: Bearer} is authorized by L{DeviceFlow.authorize}.

Secrets: device codes and access tokens are 256-bit random strings held
only as SHA-256 digests and looked up by digest (so a timing side channel
can reveal at most part of a digest, which does not help to find the
secret); they and the C{code} a node reports never appear in a log line,
an error message or a listing.  A user code is a public reference to one
request (knowing it grants nothing without the owner certificate), so it
is logged and journaled to let the owner match the console to the journal.

Answers follow golang.org/x/oauth2: errors are 400 JSON C{{"error": ...}};
polls are paced by L{PollPacer} (C{slow_down} adds 5 s for good); the
access token is handed out once, on the first poll after approval (the
client stops at the first 200; later polls get C{invalid_grant}, and only a
digest of the token is kept); an expired request answers C{expired_token}
for one more lifetime, then is forgotten.

Brute force: code requests, and polls with unknown device codes, bad
parameters or too early (C{slow_down}), spend from a per-source and global
L{RateLimiter} (429 C{rate_limited}); at most C{maxPending} requests are
held (503 C{temporarily_unavailable}); failed approvals spend from a small
budget (RFC 8628 section 5.1: about 5 guesses per code lifetime), and once
it is spent every approval is refused for a while, right guesses included.

A device-flow approval only lets a node fetch its ready run's config; it
never approves an EK binding [T1] and touches no binding at all.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from fleetd.boot.deviceflow_model import (
    ALPHABET,
    GRANT_TYPE,
    MAX_VALUE,
    REPORTED,
    USER_CODE_LENGTH,
    Answer,
    DeviceFlowError,
    Grant,
    IRunLookup,
    PendingRequest,
    displayUserCode,
    normaliseUserCode,
)
from fleetd.boot.ratelimit import PollPacer, RateLimiter, sourceKey

__all__ = [
    "ALPHABET",
    "GRANT_TYPE",
    "REPORTED",
    "USER_CODE_LENGTH",
    "DeviceFlow",
    "DeviceFlowError",
    "Grant",
    "IRunLookup",
    "PendingRequest",
    "displayUserCode",
    "normaliseUserCode",
]


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def _value(form: Mapping[str, str], name: str) -> str | None:
    """A form value, or L{None} if absent; raise if too long or unprintable."""
    value = form.get(name)
    if value is not None and (len(value) > MAX_VALUE or not value.isprintable()):
        raise ValueError(f"{name} must be at most {MAX_VALUE} printable characters")
    return value


def _error(error: str, description: str | None = None) -> dict[str, object]:
    if description is None:
        return {"error": error}
    return {"error": error, "error_description": description}


@dataclass(eq=False)
class _Request:
    """One held request: its device-code digest, pacing and owner's view."""

    digest: bytes
    letters: str
    pacer: PollPacer
    view: PendingRequest


class DeviceFlow:
    """
    Device authorization requests, their decisions and access tokens.

    @param verificationURI: what the node's console tells the owner to
        visit; fleetd has no browser page, so no C{verification_uri_complete}
        (and no QR code pointing nowhere) is sent.
    @param expiresIn: seconds a request lives (device and user code).
    @param interval: the polling interval first asked for, in seconds.
    @param tokenExpiresIn: seconds an access token authorizes C{/config}.
    @param maxPending: how many requests are held at most, expired ones
        kept for their answers included.
    @param limiter: spends for code requests and bad polls, per peer.
    @param approveLimiter: spends for failed approvals, per owner; by
        default 5 per owner and 10 overall per C{expiresIn}.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        runs: IRunLookup,
        *,
        verificationURI: str,
        expiresIn: int = 600,
        interval: int = 5,
        tokenExpiresIn: int = 3600,
        maxPending: int = 1024,
        maxPerSource: int = 2,
        limiter: RateLimiter | None = None,
        approveLimiter: RateLimiter | None = None,
    ) -> None:
        if min(expiresIn, interval, tokenExpiresIn, maxPending) < 1:
            raise ValueError("expiresIn, interval, tokenExpiresIn, maxPending >= 1")
        self._clock = clock
        self._runs = runs
        self.verificationURI = verificationURI
        self.expiresIn = expiresIn
        self.interval = interval
        self.tokenExpiresIn = tokenExpiresIn
        self.maxPending = maxPending
        # Live requests per source: a few addresses cannot fill every slot.
        self.maxPerSource = maxPerSource
        self._limiter = limiter
        self._approveLimiter = approveLimiter or RateLimiter(
            clock,
            rate=5 / expiresIn,
            burst=5,
            globalRate=10 / expiresIn,
            globalBurst=10,
            maxSources=64,
        )
        self._requests: OrderedDict[bytes, _Request] = OrderedDict()
        self._byUser: dict[str, _Request] = {}
        self._grants: OrderedDict[bytes, tuple[Grant, float]] = OrderedDict()

    # The node's side

    def requestCode(self, form: Mapping[str, str], peer: str) -> Answer:
        """C{POST /device/code}: start a request (RFC 8628 section 3.1)."""
        self.expire()
        now = self._clock.seconds()
        if not self._spend(peer):
            return 429, _error("rate_limited")
        try:
            clientID = _value(form, "client_id")
            for unused in ("scope", "audience"):  # checked, then ignored
                _value(form, unused)
            reported = {n: v for n in REPORTED if (v := _value(form, n)) is not None}
        except ValueError as e:
            return self._refuse(peer, "invalid_request", str(e), spend=False)
        if clientID is None:
            return self._refuse(peer, "invalid_request", "client_id is required", False)
        source = sourceKey(peer)
        live = sum(
            1
            for r in self._requests.values()  # at most maxPending
            if now < r.view.expires_at and sourceKey(r.view.peer) == source
        )
        if live >= self.maxPerSource:
            self.log.warn("deviceflow.source-full {peer}", peer=peer)
            return 429, _error("rate_limited", "too many pending requests from here")
        if not self._makeRoom(now):
            self.log.warn("deviceflow.full {limit}", limit=self.maxPending)
            return 503, _error("temporarily_unavailable", "too many pending requests")
        deviceCode = secrets.token_urlsafe(32)
        letters = self._newUserCode()
        view = PendingRequest(
            user_code=displayUserCode(letters),
            reported=MappingProxyType(reported),
            peer=peer,
            client_id=clientID,
            created_at=now,
            expires_at=now + self.expiresIn,
        )
        request = _Request(_digest(deviceCode), letters, PollPacer(self.interval), view)
        self._requests[request.digest] = self._byUser[letters] = request
        self.log.info(
            "deviceflow.requested {request} {peer}",
            request=view.user_code,
            peer=peer,
            reported=sorted(reported),
        )
        return 200, {
            "device_code": deviceCode,
            "user_code": view.user_code,
            "verification_uri": self.verificationURI,
            "expires_in": self.expiresIn,
            "interval": self.interval,
        }

    def poll(self, form: Mapping[str, str], peer: str) -> Answer:
        """C{POST /token}: the device access token request (section 3.4)."""
        self.expire()
        try:
            grantType = _value(form, "grant_type")
            deviceCode = _value(form, "device_code")
            clientID = _value(form, "client_id")
        except ValueError as e:
            return self._refuse(peer, "invalid_request", str(e))
        if grantType is None:
            return self._refuse(peer, "invalid_request", "grant_type is required")
        if grantType != GRANT_TYPE:
            return self._refuse(peer, "unsupported_grant_type")
        if deviceCode is None or clientID is None:
            reason = "device_code and client_id are required"
            return self._refuse(peer, "invalid_request", reason)
        request = self._requests.get(_digest(deviceCode))
        if request is None or request.view.client_id != clientID:
            return self._refuse(peer, "invalid_grant")
        view, now = request.view, self._clock.seconds()
        if now >= view.expires_at:
            return 400, _error("expired_token")
        if view.state == "denied":
            return 400, _error("access_denied")
        if view.issued:
            return 400, _error("invalid_grant", "the token was already issued")
        if view.state == "approved":
            return self._issue(request, now)
        if request.pacer.tooFast(now):  # costs, so hammering ends in 429s
            return self._refuse(peer, "slow_down")
        return 400, _error("authorization_pending")

    def retryAfter(self, peer: str) -> int:
        """Seconds for the C{Retry-After} of a 429 or 503 to C{peer}."""
        wait = 1
        if self._limiter is not None and not self._limiter.peek(sourceKey(peer)):
            wait = self._limiter.retryAfter(sourceKey(peer))
        if len(self._requests) >= self.maxPending:
            oldest = next(iter(self._requests.values())).view.expires_at
            wait = max(wait, int(oldest - self._clock.seconds()) + 1)
        return wait

    def malformed(self, peer: str, reason: str) -> Answer:
        """The answer to a body that is not a strict form (see the resource)."""
        return self._refuse(peer, "invalid_request", reason)

    def authorize(self, accessToken: str) -> Grant | None:
        """What C{accessToken} (from C{Authorization: Bearer}) allows, if any."""
        self.expire()
        if not 0 < len(accessToken) <= MAX_VALUE:
            return None
        found = self._grants.get(_digest(accessToken))
        if found is None or self._clock.seconds() >= found[1]:
            return None
        return found[0]

    # The owner's side

    def pending(self) -> list[PendingRequest]:
        """Undecided, unexpired requests, oldest first."""
        self.expire()
        now = self._clock.seconds()
        return [
            r.view
            for r in self._requests.values()
            if r.view.state == "pending" and now < r.view.expires_at
        ]

    def approve(
        self, userCode: str, device: str, owner: str, force: bool = False
    ) -> PendingRequest:
        """
        Let the request C{userCode} fetch C{device}'s ready run.

        A request whose reported uuid or serial differ from the inventory's
        is refused (C{"mismatch"}) unless C{force}: approving a stranger's
        request would hand it this device's configuration (RFC 8628 5.4).

        @raise DeviceFlowError: see L{DeviceFlowError.kind}.
        """
        request = self._decidable(userCode, owner)
        if not (0 < len(device) <= 128 and device.isprintable()):
            raise DeviceFlowError("invalid", "device: not a device name")
        if not force:
            self._checkIdentity(request.view.reported, device)
        run = self._runs.readyRun(device)
        if run is None:
            message = f"{device} has no ready run: provision {device} first"
            raise DeviceFlowError("no-ready-run", message)
        request.view = replace(
            request.view, state="approved", device=device, run=run, decided_by=owner
        )
        self.log.info(
            "deviceflow.approved {request} {device} {run} {owner}",
            request=request.view.user_code,
            device=device,
            run=run,
            owner=owner,
        )
        return request.view

    def _checkIdentity(self, reported: Mapping[str, str], device: str) -> None:
        """
        Refuse unless the node reported the uuid and serial the inventory
        holds for C{device}: the bearer token skips the boot path's own
        identity check, so this is where a stranger is stopped.
        """
        known = self._runs.identity(device)
        if known is None:
            raise DeviceFlowError("mismatch", f"no uuid/serial known for {device}")
        missing = [name for name in ("uuid", "serial") if name not in reported]
        if missing:
            raise DeviceFlowError(
                "mismatch",
                f"the request did not report its {' and '.join(missing)}"
                " (talos.config.oauth.extra_variable); check the machine, then force",
            )
        differ = [
            name
            for name, value in zip(("uuid", "serial"), known, strict=True)
            if reported[name].strip().casefold() != value.casefold()
        ]
        if differ:
            raise DeviceFlowError(
                "mismatch",
                f"the request reported another {' and '.join(differ)} than {device}",
            )

    def deny(self, userCode: str, owner: str) -> PendingRequest:
        """Refuse the request C{userCode}; its node's next poll stops."""
        request = self._decidable(userCode, owner)
        request.view = replace(request.view, state="denied", decided_by=owner)
        self.log.info(
            "deviceflow.denied {request} {owner}",
            request=request.view.user_code,
            owner=owner,
        )
        return request.view

    def expire(self) -> None:
        """
        Forget requests one lifetime after they expired, and expired tokens.
        Requests (and tokens) all live equally long, so the oldest are first.
        """
        now = self._clock.seconds()
        while self._requests:
            oldest = next(iter(self._requests.values()))
            if now < oldest.view.expires_at + self.expiresIn:
                break
            self._forget(oldest)
        while self._grants and now >= next(iter(self._grants.values()))[1]:
            self._grants.popitem(last=False)

    # Helpers

    def _spend(self, peer: str) -> bool:
        return self._limiter is None or self._limiter.allow(sourceKey(peer))

    def _refuse(
        self, peer: str, error: str, reason: str | None = None, spend: bool = True
    ) -> Answer:
        """A bad request costs the peer a token; with none left it is a 429."""
        if spend and not self._spend(peer):
            return 429, _error("rate_limited")
        self.log.warn("deviceflow.refused {error} {peer}", error=error, peer=peer)
        return 400, _error(error, reason)

    def _makeRoom(self, now: float) -> bool:
        """Make room for one more request, dropping an expired one if need be."""
        if len(self._requests) < self.maxPending:
            return True
        oldest = next(iter(self._requests.values()))
        if now < oldest.view.expires_at:
            return False
        self._forget(oldest)
        return True

    def _forget(self, request: _Request) -> None:
        del self._requests[request.digest]
        del self._byUser[request.letters]

    def _newUserCode(self) -> str:
        while True:  # 20**8 codes against at most maxPending held ones
            letters = "".join(secrets.choice(ALPHABET) for _ in range(USER_CODE_LENGTH))
            if letters not in self._byUser:
                return letters

    def _issue(self, request: _Request, now: float) -> Answer:
        view = request.view
        assert view.device is not None and view.run is not None
        token = secrets.token_urlsafe(32)
        grant = Grant(view.device, view.run)
        self._grants[_digest(token)] = (grant, now + self.tokenExpiresIn)
        while len(self._grants) > self.maxPending:
            self._grants.popitem(last=False)
        request.view = replace(view, issued=True)
        self.log.info(
            "deviceflow.issued {request} {device} {run} {peer}",
            request=view.user_code,
            device=grant.device,
            run=grant.run,
            peer=view.peer,
        )
        return 200, {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": self.tokenExpiresIn,
        }

    def _decidable(self, userCode: str, owner: str) -> _Request:
        """The undecided request C{userCode} names, or raise."""
        self.expire()
        budget = self._approveLimiter
        if not budget.peek(owner):
            wait = budget.retryAfter(owner)
            message = f"too many unknown user codes: try again in {wait} s"
            raise DeviceFlowError("too-many-attempts", message)
        letters = normaliseUserCode(userCode)
        request = None if letters is None else self._byUser.get(letters)
        if request is None:
            budget.allow(owner)
            raise DeviceFlowError("unknown-user-code", "no such user code")
        view = request.view
        if self._clock.seconds() >= view.expires_at:
            raise DeviceFlowError("expired", f"user code {view.user_code} has expired")
        if view.state != "pending":
            message = f"user code {view.user_code} is already {view.state}"
            raise DeviceFlowError("already-decided", message)
        return request
