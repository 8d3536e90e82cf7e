"""
A small NetBox REST client on treq (notes/kube-netbox.md section 6).

fleetd uses about five endpoints, so this is a thin layer rather than
pynetbox (synchronous, on requests): JSON in and out, the token's scheme
chosen by its form (C{Bearer nbt_...} for v2 tokens, C{Token ...} for
v1), C{url} with an optional base path, lists that follow C{next} to the
end, detail reads that keep the C{ETag}, and PATCHes with C{If-Match}.
Every call has a deadline on the injected clock. Failures are
L{NetBoxError}s whose C{kind} says what the caller can do about them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlencode, urljoin, urlsplit

import treq
from twisted.internet.defer import Deferred, TimeoutError, fail, succeed
from twisted.internet.error import ConnectError, ConnectionLost
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.web.client import ResponseFailed

NetBoxErrorKind = Literal[
    "unavailable",  # down, hung, 5xx: retry later
    "timeout",  # no answer in time: the request may or may not have landed
    "invalid",  # 400: NetBox refused the content; retrying cannot help
    "forbidden",  # 401/403: the token is missing, wrong, read-only or expired
    "not-found",  # 404
    "conflict",  # 412: the object changed since it was read
]

DEFAULT_TIMEOUT = 15.0
# Retries after NetBox failed (the push, the mirror, the start-up check):
# 1 s doubling to RETRY_MAX, never more, so whatever the outage's length
# NetBox answering again is noticed within RETRY_MAX (+ one deadline).
RETRY_FIRST = 1.0
RETRY_MAX = 10.0
PAGE_LIMIT = 1000  # NetBox's MAX_PAGE_SIZE default
MAX_PAGES = 10_000
MAX_BODY = 16 * 1024 * 1024


class _TooLarge(Exception):
    """An answer grew past C{MAX_BODY} while it was read."""


class NetBoxError(Exception):
    """A NetBox call failed; C{str()} is one line for an operator."""

    def __init__(self, message: str, kind: NetBoxErrorKind) -> None:
        super().__init__(message)
        self.message = message
        self.kind: NetBoxErrorKind = kind

    def __str__(self) -> str:
        return self.message


class IHTTP(Protocol):
    """What the client needs of treq's C{HTTPClient} (and of C{StubTreq})."""

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, list[str]],
        data: bytes | None,
    ) -> Deferred[Any]:
        """Issue one request; fire with an L{IResponse}."""


def authorization(token: str) -> str:
    """
    The C{Authorization} header value for C{token}: v2 tokens (NetBox
    4.5 and later) start with C{nbt_} and are sent as C{Bearer}; anything
    else is a v1 token, sent as C{Token} (deprecated in 4.6).
    """
    token = token.strip()
    if not token or any(c.isspace() for c in token) or not token.isprintable():
        raise ValueError("the NetBox token is empty or contains spaces")
    if token.startswith("nbt_"):
        return f"Bearer {token}"
    return f"Token {token}"


def checkURL(url: str) -> str:
    """The base URL, ending in C{/}; C{http} or C{https}, maybe with a path."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r} must not carry a query or fragment")
    return url if url.endswith("/") else url + "/"


@dataclass(frozen=True)
class Detail:
    """One object as its detail endpoint returned it, with its ETag."""

    data: dict[str, Any]
    etag: str | None


def _summary(status: int, body: bytes) -> str:
    """NetBox's error body boiled down to one short line (field messages)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return f"HTTP {status}"
    parts: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            elif isinstance(value, dict):
                value = "; ".join(f"{k}: {v}" for k, v in value.items())
            parts.append(str(value) if key == "detail" else f"{key}: {value}")
    elif isinstance(doc, list):
        parts.extend(str(item) for item in doc)
    text = "; ".join(parts).replace("\n", " ") or f"HTTP {status}"
    return text if len(text) <= 300 else text[:297] + "..."


class NetBoxClient:
    """JSON calls against one NetBox, with one token and one deadline each."""

    def __init__(
        self,
        http: IHTTP,
        clock: IReactorTime,
        url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        closer: Callable[[], Deferred[None]] | None = None,
    ) -> None:
        self._http = http
        self._closer = closer
        self._inflight: set[Deferred[tuple[Any, str | None]]] = set()
        self._closed = False
        self._clock = clock
        self.base = checkURL(url)
        self._auth = authorization(token)
        self.timeout = timeout
        self.maxBody = MAX_BODY

    def close(self) -> Deferred[None]:
        """On stop: cancel the requests in flight (a connection that
        finished one later would go back to the pool, open), then close
        the idle connections; fire when they are closed. Later calls fail
        at once: nothing opens a connection once fleetd is stopping."""
        self._closed = True
        for call in list(self._inflight):
            call.cancel()
        if self._closer is None:
            return succeed(None)
        # A response read to its end fires its caller before its connection
        # goes back to the pool, in the same turn: close on the next one.
        closer = self._closer
        turn: Deferred[None] = deferLater(self._clock, 0, lambda: None)
        return turn.addCallback(lambda _: closer())

    def url(self, path: str, params: Mapping[str, str | int] | None = None) -> str:
        """C{path} (like C{api/dcim/devices/}) under the base URL."""
        url = urljoin(self.base, path.lstrip("/"))
        if params:
            url += "?" + urlencode(sorted(params.items()))
        return url

    def _sameOrigin(self, url: str) -> str:
        """A C{next} link must stay on this NetBox (the token goes with it)."""
        mine, theirs = urlsplit(self.base), urlsplit(url)
        if (mine.scheme, mine.netloc) != (theirs.scheme, theirs.netloc):
            if mine.netloc != theirs.netloc:
                raise NetBoxError(
                    f"NetBox sent a next page on another server: {theirs.netloc}",
                    "invalid",
                )
            # Behind a TLS proxy NetBox may say http://; keep our scheme.
            url = theirs._replace(scheme=mine.scheme).geturl()
        return url

    def call(
        self, method: str, url: str, body: object = None, ifMatch: str | None = None
    ) -> Deferred[tuple[Any, str | None]]:
        """
        One request; fire with the decoded JSON body (None for 204) and
        the ETag, or fail with a L{NetBoxError}.
        """
        if self._closed:
            return fail(
                NetBoxError(
                    f"{method} {self._show(url)}: fleetd is stopping", "unavailable"
                )
            )
        d = Deferred.fromCoroutine(self._call(method, url, body, ifMatch))
        d.addTimeout(self.timeout, self._clock, onTimeoutCancel=_timedOut)
        self._inflight.add(d)

        def settled(result: object) -> object:
            self._inflight.discard(d)
            return result

        d.addBoth(settled)
        d.addErrback(self._translate, method, url)
        return d

    async def _call(
        self, method: str, url: str, body: object, ifMatch: str | None
    ) -> tuple[Any, str | None]:
        headers = {"Authorization": [self._auth], "Accept": ["application/json"]}
        data = None
        if body is not None:
            headers["Content-Type"] = ["application/json"]
            data = json.dumps(body).encode("utf-8")
        if ifMatch is not None:
            headers["If-Match"] = [ifMatch]
        response = await self._http.request(method, url, headers=headers, data=data)
        content = await self._content(response, method, url)
        status = response.code
        etags = response.headers.getRawHeaders("etag") or [None]
        if 200 <= status < 300:
            if status == 204 or not content:
                return None, etags[0]
            try:
                return json.loads(content), etags[0]
            except ValueError:
                raise NetBoxError(
                    f"{method} {self._show(url)}: NetBox answered {status}"
                    " with a body that is not JSON",
                    "unavailable",
                ) from None
        where = f"{method} {self._show(url)}"
        reason = _summary(status, content)
        if status == 400:
            raise NetBoxError(f"{where} refused: {reason}", "invalid")
        if status in (401, 403):
            raise NetBoxError(
                f"{where} forbidden ({status}): {reason}; check [netbox] token_file"
                " (a read-only or expired token, or one bound to other addresses)",
                "forbidden",
            )
        if status == 404:
            raise NetBoxError(f"{where}: not found", "not-found")
        if status == 412:
            raise NetBoxError(f"{where}: changed since it was read", "conflict")
        raise NetBoxError(f"{where}: NetBox answered {status}: {reason}", "unavailable")

    async def _content(self, response: Any, method: str, url: str) -> bytes:
        """
        The answer's body, at most C{maxBody} bytes: past that (declared or
        as it arrives) the connection is dropped and the call fails.
        """
        limit = self.maxBody
        length = getattr(response, "length", None)
        size = length if isinstance(length, int) and length > limit else 0
        chunks: list[bytes] = []

        def collect(data: bytes) -> None:
            nonlocal size
            size += len(data)
            if size > limit:
                raise _TooLarge()
            chunks.append(data)

        try:
            await treq.collect(response, collect)
        except _TooLarge:
            raise NetBoxError(
                f"{method} {self._show(url)}: NetBox's answer is larger than"
                f" {limit // (1024 * 1024)} MiB; fleetd stopped reading it",
                "unavailable",
            ) from None
        return b"".join(chunks)

    def _show(self, url: str) -> str:
        """A URL for messages: the path only (no host, no query)."""
        return urlsplit(url).path

    def _translate(
        self, failure: Any, method: str, url: str
    ) -> Any:  # Failure -> Failure
        if failure.check(NetBoxError):
            return failure
        where = f"{method} {self._show(url)}"
        if failure.check(TimeoutError, ConnectError, ConnectionLost, ResponseFailed):
            # A pooled connection NetBox dropped without a word (a restart,
            # a cut link) would cost the next call its whole deadline too.
            self._dropIdle()
        if failure.check(TimeoutError):
            raise NetBoxError(f"{where}: no answer within {self.timeout:g}s", "timeout")
        if failure.check(ConnectError, ConnectionLost, ResponseFailed, OSError):
            raise NetBoxError(
                f"{where}: NetBox unreachable: {failure.getErrorMessage()}",
                "unavailable",
            )
        return failure

    def _dropIdle(self) -> None:
        """Close the pool's idle connections: the next call opens a new one."""
        if self._closer is not None and not self._closed:
            self._closer().addErrback(lambda f: None)

    # Conveniences

    def detail(self, path: str) -> Deferred[Detail]:
        """GET one object's detail endpoint, keeping its ETag."""
        d = self.call("GET", self.url(path))
        return d.addCallback(lambda r: Detail(_object(r[0], path), r[1]))

    async def listAll(
        self, path: str, params: Mapping[str, str | int] | None = None
    ) -> list[dict[str, Any]]:
        """Every result of a list endpoint, following C{next} to the end."""
        query = dict(params or {})
        query.setdefault("limit", PAGE_LIMIT)
        url: str | None = self.url(path, query)
        results: list[dict[str, Any]] = []
        pages = 0
        while url is not None:
            pages += 1
            if pages > MAX_PAGES:
                raise NetBoxError(f"GET {path}: more than {MAX_PAGES} pages", "invalid")
            doc, _ = await self.call("GET", url)
            if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
                raise NetBoxError(f"GET {path}: not a NetBox list", "unavailable")
            results.extend(_object(item, path) for item in doc["results"])
            following = doc.get("next")
            url = None if not following else self._sameOrigin(str(following))
        return results

    def patch(
        self, path: str, body: Mapping[str, Any], ifMatch: str | None
    ) -> Deferred[dict[str, Any]]:
        """PATCH only the fields given, with C{If-Match} when an ETag is known."""
        d = self.call("PATCH", self.url(path), dict(body), ifMatch)
        return d.addCallback(lambda r: _object(r[0], path))

    def post(self, path: str, body: Mapping[str, Any]) -> Deferred[dict[str, Any]]:
        d = self.call("POST", self.url(path), dict(body))
        return d.addCallback(lambda r: _object(r[0], path))


def _timedOut(result: object, timeout: float) -> object:
    """
    The deadline cancelled the call: it timed out, whatever the cancelled
    request failed with (the agent reports a request cut off before its
    answer as C{ResponseNeverReceived}, not as a cancellation).
    """
    raise TimeoutError(f"no answer within {timeout:g}s")


def _object(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise NetBoxError(f"{path}: NetBox answered with no object", "unavailable")
    return value
