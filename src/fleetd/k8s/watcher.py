"""
List, then watch, a collection; hand every object to a callback.

The loop (api-concepts, notes kube-netbox.md section 2.3): LIST gives the
objects and a resourceVersion; WATCH from it with bookmarks; every event
(and BOOKMARK) advances the version; a stream the server ends is resumed
from the last version at once; an ERROR event or answer with 410 Gone
means the version is too old: LIST again. Anything else (API down,
5xx, a broken stream) waits with exponential backoff on the injected
clock before trying again. L{stop} cancels the call or wait in progress.

No object can end the loop (issue 17): a callback that raises on one
object (a listed item, an event's object, a whole C{onList} snapshot) is
contained there: logged as a failure, counted (C{onObjectFailed}), and
skipped; the loop goes on with the next object.

L{ListWatcher} is the loop for any collection: the watch of kubelet
client CSRs (L{fleetd.kube.csrwatcher}, the approver [K2]) and the
Workflow watch of boot completion (L{fleetd.tink.wfstate}) are two.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from fleetd.k8s.client import Gone, KubeError, KubeUnavailable, Watch

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0

Lister = Callable[[], Coroutine[Any, Any, tuple[list[dict[str, Any]], str]]]
Watcher = Callable[[str, Callable[[dict[str, Any]], None], int], Watch]


class ListWatcher:
    """
    Keep C{onObject} told of every object of a collection, across failures.

    @param onList: when given, gets each LIST's items at once (instead of
        C{onObject} per item), so the caller can tell a snapshot from a
        change and forget what the snapshot no longer holds.
    @param onDeleted: gets each DELETED event's object.
    @param onFailure: gets every failure (after it is counted), with the
        error: for metrics.
    @param onWatching: called each time a watch stream is open after a
        successful LIST or resume (C{True}), and when the loop waits after
        a failure (C{False}).
    @param onObjectFailed: called each time a callback raised on an object
        (contained and skipped): for metrics.
    @param log: where failures are told (a L{fleetd.logs.ThrottledLog} for
        a loop whose failures must not flood the log).
    """

    def __init__(
        self,
        clock: IReactorTime,
        lister: Lister,
        watcher: Watcher,
        onObject: Callable[[dict[str, Any]], None],
        *,
        timeoutSeconds: int = 300,
        name: str = "kube.watch",
        onList: Callable[[list[dict[str, Any]]], None] | None = None,
        onDeleted: Callable[[dict[str, Any]], None] | None = None,
        onFailure: Callable[[KubeError], None] | None = None,
        onWatching: Callable[[bool], None] | None = None,
        onObjectFailed: Callable[[], None] | None = None,
        log: Any = None,
    ) -> None:
        self.clock = clock
        self.lister = lister
        self.watcher = watcher
        self.onObject = onObject
        self.onList = onList
        self.onDeleted = onDeleted
        self.onFailure = onFailure
        self.onWatching = onWatching
        self.onObjectFailed = onObjectFailed
        self.name = name
        self.timeoutSeconds = timeoutSeconds
        self.log: Any = Logger() if log is None else log
        self.resourceVersion: str | None = None
        self.lists = 0
        self.failures = 0
        self.objectFailures = 0
        self._running = False
        self._waiting: Deferred[Any] | None = None
        self._watch: Watch | None = None
        self._loop: Deferred[None] | None = None
        self._freshList = False

    def start(self) -> None:
        self._running = True
        self._loop = Deferred.fromCoroutine(self._run())
        self._loop.addErrback(
            lambda f: Logger().failure("{name}.crashed", f, name=self.name)
        )

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

    def _told(self, watching: bool) -> None:
        if self.onWatching is not None:
            self.onWatching(watching)

    async def _run(self) -> None:
        backoff = FIRST_BACKOFF
        while self._running:
            try:
                if self.resourceVersion is None:
                    items, rv = await self._wait(Deferred.fromCoroutine(self.lister()))
                    self.lists += 1
                    self._freshList = True
                    if self.onList is not None:
                        self._contained(self.onList, items)
                    else:
                        for item in items:
                            self._contained(self.onObject, item)
                    self.resourceVersion = rv
                self._watch = self.watcher(
                    self.resourceVersion, self._event, self.timeoutSeconds
                )
                self._told(True)
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
            except Gone as e:
                self.log.info("{name}.expired: listing again", name=self.name)
                if self.onFailure is not None:
                    self.onFailure(e)
                self.resourceVersion = None
                if self._freshList:  # 410 straight after a list: do not spin
                    self._told(False)
                    try:
                        await self._wait(deferLater(self.clock, backoff, lambda: None))
                    except CancelledError:
                        return
                    backoff = min(backoff * 2, MAX_BACKOFF)
            except KubeError as e:
                if not self._running:
                    return
                self.failures += 1
                if self.onFailure is not None:
                    self.onFailure(e)
                self._told(False)
                self.log.warn(
                    "{name}.failed {reason}; again in {delay}s",
                    name=self.name,
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
            self._contained(self.onObject, obj)
        elif kind == "DELETED" and self.onDeleted is not None:
            self._contained(self.onDeleted, obj)

    def _contained(self, callback: Callable[[Any], None], what: Any) -> None:
        """Hand C{what} to C{callback}; whatever it raises ends there."""
        try:
            callback(what)
        except Exception:
            self.objectFailures += 1
            if self.onObjectFailed is not None:
                self.onObjectFailed()
            self.log.failure(
                "{name}.object-failed {object}: skipped",
                failure=Failure(),
                name=self.name,
                object=_objectName(what),
            )


def _objectName(what: Any) -> str:
    """An object's name for the log (C{"?"} when it has none)."""
    if isinstance(what, list):
        return f"list of {len(what)}"
    meta = what.get("metadata") if isinstance(what, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name[:253] if isinstance(name, str) else "?"
