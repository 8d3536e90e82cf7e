"""
List, then watch, kubelet client CSRs; hand every one to a callback.

The loop (api-concepts, notes kube-netbox.md section 2.3): LIST gives the
objects and a resourceVersion; WATCH from it with bookmarks; every event
(and BOOKMARK) advances the version; a stream the server ends is resumed
from the last version at once; an ERROR event or answer with 410 Gone
means the version is too old: LIST again. Anything else (API down,
5xx, a broken stream) waits with exponential backoff on the injected
clock before trying again. L{stop} cancels the call or wait in progress.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from fleetd.kube.client import Gone, KubeClient, KubeError, KubeUnavailable, Watch

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0


class CSRWatcher:
    """Keep C{onCSR} told of every kubelet client CSR, across failures."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        client: KubeClient,
        onCSR: Callable[[dict[str, Any]], None],
        *,
        timeoutSeconds: int = 300,
    ) -> None:
        self.clock = clock
        self.client = client
        self.onCSR = onCSR
        self.timeoutSeconds = timeoutSeconds
        self.resourceVersion: str | None = None
        self.lists = 0
        self.failures = 0
        self._running = False
        self._waiting: Deferred[Any] | None = None
        self._watch: Watch | None = None
        self._loop: Deferred[None] | None = None
        self._freshList = False

    def start(self) -> None:
        self._running = True
        self._loop = Deferred.fromCoroutine(self._run())
        self._loop.addErrback(lambda f: self.log.failure("kube.watch.crashed", f))

    def stop(self) -> Deferred[None] | None:
        self._running = False
        if self._watch is not None:
            self._watch.stop()
        if self._waiting is not None:
            self._waiting.cancel()
        return self._loop

    async def _wait(self, d: Deferred[Any]) -> Any:
        self._waiting = d
        try:
            return await d
        finally:
            self._waiting = None

    async def _run(self) -> None:
        backoff = FIRST_BACKOFF
        while self._running:
            try:
                if self.resourceVersion is None:
                    items, rv = await self._wait(
                        Deferred.fromCoroutine(self.client.listCSRs())
                    )
                    self.lists += 1
                    self._freshList = True
                    for item in items:
                        self.onCSR(item)
                    self.resourceVersion = rv
                self._watch = self.client.watchCSRs(
                    self.resourceVersion, self._event, self.timeoutSeconds
                )
                try:
                    await self._watch.done
                finally:
                    self._watch = None
                backoff = FIRST_BACKOFF  # a clean end: resume from where we are
                self._freshList = False
            except CancelledError:
                if not self._running:
                    return
                raise
            except Gone:
                self.log.info("kube.watch.expired: listing again")
                self.resourceVersion = None
                if self._freshList:  # 410 straight after a list: do not spin
                    try:
                        await self._wait(deferLater(self.clock, backoff, lambda: None))
                    except CancelledError:
                        return
                    backoff = min(backoff * 2, MAX_BACKOFF)
            except KubeError as e:
                if not self._running:
                    return
                self.failures += 1
                self.log.warn(
                    "kube.watch.failed {reason}; again in {delay}s",
                    reason=str(e),
                    delay=backoff,
                )
                try:
                    await self._wait(deferLater(self.clock, backoff, lambda: None))
                except CancelledError:
                    return
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone("watch: resourceVersion too old", 410, "Expired")
            raise KubeUnavailable(f"watch: error event {code}: {obj.get('message')}")
        self._freshList = False
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resourceVersion = str(version)
        if kind in ("ADDED", "MODIFIED"):
            self.onCSR(obj)
