"""
The Workflow's state read from Kubernetes: boot completion's second
"done" signal (issue 10, item 3) [B1] [B2].

Opt-in (C{[tink] workflow_state = "kubernetes"} with C{workflow_namespace}).
A L{ListWatcher} lists and watches C{workflows.tinkerbell.org} (v1alpha1)
through the C{[kubernetes]} cluster client. A Workflow has ended when its
C{status.state} is POST (the last action succeeded; tink-controller's post
steps, such as turning network boot off, are running) or SUCCESS (they
are done); tink v0.12 spells them C{STATE_POST}, C{STATE_SUCCESS}. POST is
the moment the proxy's own inference fires (the agent's next C{GetAction}
is refused because the workflow left RUNNING), so both signals mean the
same thing. PREPARING, PENDING, RUNNING, FAILED, TIMEOUT and anything
unknown have not ended.

The boot tracker is told of an end (L{WorkflowWatcher.workflowFinished})
when a Workflow seen before as not ended has ended (a watch event, or a
list after a gap: it ended meanwhile), or when a Workflow is first seen
already ended (the list at start, or one created during a gap): then with
its creation time, which the tracker holds against the run's. The device
is the one the Workflow's agent id maps to (C{status.agentID}, then
C{status.currentState.agentID}, then each task's C{agentID} or tink
v0.12's C{worker}), through the proxy's own L{DeviceIndex}. An end whose
ids map to no device, or to several, is kept and tried again every
L{RETRY_UNMAPPED} seconds (the index loads the inventory's MACs again when
an id is missing, at most every 30 s: a device added since shows up
there), for up to L{UNMAPPED_FOR} seconds, at most L{MAX_UNMAPPED} ends
at a time; then it is dropped with a log line.

With C{[tinkerbell]} the same watch also tells an observer
(L{IWorkflowObserver}: L{fleetd.tinkerbell.watching.Reports}) of every
Workflow it sees, each deletion and each list, so fleetd follows the
state of the Workflows it made and reports what someone else did to one
(issue 28); the ends then reach boot completion only with
C{tink.workflow_state = "kubernetes"}.

Nothing here can stop or slow the proxy: failures (API down, 403, a CRD
that is not installed, 410) are counted in
C{fleetd_tink_workflow_watch_errors_total{reason}}, logged at most a few
times a minute, and retried with backoff; C{fleetd_tink_workflow_watch_up}
is 1 while a watch stream is open.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from fleetd.k8s.client import Gone, KubeClient, KubeError, KubeUnavailable
from fleetd.k8s.watcher import ListWatcher
from fleetd.logs import ThrottledLog

ENDED = frozenset({"POST", "SUCCESS"})
RETRY_UNMAPPED = 30.0
UNMAPPED_FOR = 3600.0
MAX_UNMAPPED = 1024
REASONS = ("unavailable", "expired", "forbidden", "not-found", "error")
RBAC_FILE = "conf/kube/fleetd-workflows-rbac.yaml"
_log = Logger()


class IDeviceLookup(Protocol):
    def lookup(self, workerId: str) -> str | None: ...


class IWorkflowEnds(Protocol):
    def workflowFinished(
        self, device: str, workflow: str, createdAt: float | None
    ) -> None: ...


class IWorkflowObserver(Protocol):
    """Told of every Workflow the watch sees (L{fleetd.tinkerbell})."""

    def workflowSeen(self, workflow: dict[str, Any]) -> None:
        "An event's (ADDED, MODIFIED) or a list's Workflow, as it is now."

    def workflowDeleted(self, workflow: dict[str, Any]) -> None:
        "A DELETED event's Workflow."

    def workflowsListed(self, workflows: list[dict[str, Any]]) -> None:
        "A list's every Workflow (after a start or a gap), once seen each."


def hasEnded(state: object) -> bool:
    """Whether a Workflow's C{status.state} says its last action succeeded."""
    if not isinstance(state, str):
        return False
    return state.upper().removeprefix("STATE_") in ENDED


def agentIds(workflow: dict[str, Any]) -> list[str]:
    """The agent (worker) ids a Workflow names, most authoritative first."""
    status = workflow.get("status") or {}
    found = [status.get("agentID"), (status.get("currentState") or {}).get("agentID")]
    for task in (status.get("tasks") or [])[:16]:
        if isinstance(task, dict):
            found += [task.get("agentID"), task.get("worker")]
    return [i for i in found if isinstance(i, str) and i]


def parseCreated(text: object) -> float | None:
    """C{metadata.creationTimestamp} (RFC 3339) as seconds, or L{None}."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def failureReason(error: KubeError) -> str:
    """The C{reason} label of a watch failure."""
    if isinstance(error, Gone):
        return "expired"
    if isinstance(error, KubeUnavailable):
        return "unavailable"
    if error.code in (401, 403):
        return "forbidden"
    if error.code == 404:
        return "not-found"
    return "error"


class WorkflowStateMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.up = Gauge(
            "fleetd_tink_workflow_watch_up",
            "1 while fleetd watches the Workflows' state in Kubernetes.",
            registry=registry,
        )
        self.errors = Counter(
            "fleetd_tink_workflow_watch_errors_total",
            "Failures listing or watching Workflows: unavailable, expired"
            " (410, listed again), forbidden, not-found (no CRD), error.",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.errors.labels(reason)
        self.ends = Counter(
            "fleetd_tink_workflow_state_ends_total",
            "Workflow ends (POST or SUCCESS) read from Kubernetes and handed"
            " to boot completion.",
            registry=registry,
        )


@dataclass
class _Unmapped:
    """An end whose agent ids map to no one device yet."""

    workflow: dict[str, Any]
    name: str
    createdAt: float
    since: float


class WorkflowStateWatch:
    """List and watch Workflows; tell the boot side which ones ended."""

    def __init__(
        self,
        clock: IReactorTime,
        client: KubeClient,
        namespace: str | None,
        devices: IDeviceLookup,
        ends: IWorkflowEnds | None,
        *,
        registry: CollectorRegistry | None = None,
        timeoutSeconds: int = 300,
        observer: IWorkflowObserver | None = None,
    ) -> None:
        """
        @param ends: boot completion (L{None}: the watch serves only the
            C{observer}).
        """
        self.observer = observer
        self.namespace = namespace
        self.devices = devices
        self.ends = ends
        self.metrics = WorkflowStateMetrics(registry)
        self.log = ThrottledLog(clock, burst=2, window=60.0)
        self._ended: dict[str, bool] = {}  # uid -> ended when last seen
        self._unmapped: dict[str, _Unmapped] = {}  # uid -> an end not yet told
        self._retry: IDelayedCall | None = None
        self._stopped = False
        self._clock = clock
        self._failing = False
        self.loop = ListWatcher(
            clock,
            lambda: client.listWorkflows(namespace),
            lambda rv, onEvent, timeout: client.watchWorkflows(
                namespace, rv, onEvent, timeout
            ),
            self._guarded,
            timeoutSeconds=timeoutSeconds,
            name="tink.workflow-state.watch",
            onList=self._listed,
            onDeleted=self._deleted,
            onFailure=self._failed,
            onWatching=self._watching,
            log=self.log,
        )

    def start(self) -> None:
        self._stopped = False
        self.loop.start()

    def stop(self) -> Deferred[None] | None:
        self.metrics.up.set(0)
        self._stopped = True
        self._unmapped.clear()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        return self.loop.stop()

    # From the loop

    def _listed(self, items: list[dict[str, Any]]) -> None:
        present = set()
        for item in items:
            present.add(self._key(item))
            self._guarded(item, listed=True)
        for gone in set(self._ended) - present:
            del self._ended[gone]  # deleted during a gap
            self._unmapped.pop(gone, None)
        if self.observer is not None:
            self._tell(self.observer.workflowsListed, items)

    def _deleted(self, workflow: dict[str, Any]) -> None:
        key = self._key(workflow)
        self._ended.pop(key, None)
        self._unmapped.pop(key, None)
        if self.observer is not None:
            self._tell(self.observer.workflowDeleted, workflow)

    @staticmethod
    def _tell(what: Any, value: Any) -> None:
        """The observer's bug is logged, never the watch's end."""
        try:
            what(value)
        except Exception:
            _log.failure("tink.workflow-state.observer-bug")

    def _watching(self, watching: bool) -> None:
        self.metrics.up.set(1 if watching else 0)
        if watching and self._failing:
            self.log.info(
                "tink.workflow-state.watching {namespace}",
                namespace=self.namespace or "*",
            )
        self._failing = not watching

    def _failed(self, error: KubeError) -> None:
        reason = failureReason(error)
        self.metrics.errors.labels(reason).inc()
        if reason == "forbidden":
            self.log.warn(
                "tink.workflow-state.forbidden: fleetd may not list and watch"
                " workflows.tinkerbell.org in {namespace}; see {rbac}",
                namespace=self.namespace or "all namespaces",
                rbac=RBAC_FILE,
            )
        elif reason == "not-found":
            self.log.warn(
                "tink.workflow-state.no-crd: the cluster of [kubernetes] serves"
                " no workflows.tinkerbell.org/v1alpha1"
            )

    @staticmethod
    def _key(workflow: dict[str, Any]) -> str:
        meta = workflow.get("metadata") or {}
        uid = meta.get("uid")
        if isinstance(uid, str) and uid:
            return uid
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def _guarded(self, workflow: dict[str, Any], listed: bool = False) -> None:
        """L{_seen}, with a bug logged instead of stopping the watch."""
        if self.ends is not None:
            try:
                self._seen(workflow)
            except Exception:
                _log.failure("tink.workflow-state.bug")
        if self.observer is not None and not listed:
            self._tell(self.observer.workflowSeen, workflow)

    def _seen(self, workflow: dict[str, Any]) -> None:
        key = self._key(workflow)
        ended = hasEnded((workflow.get("status") or {}).get("state"))
        before = self._ended.get(key)
        self._ended[key] = ended
        if not ended:
            self._unmapped.pop(key, None)  # running again: that end is moot
        elif key in self._unmapped:
            self._unmapped[key].workflow = workflow  # agent ids may show up
        if not ended or before is True:
            return
        meta = workflow.get("metadata") or {}
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        createdAt = None
        if before is None:  # first seen already ended: when was it made?
            createdAt = parseCreated(meta.get("creationTimestamp"))
            if createdAt is None:
                self.log.warn(
                    "tink.workflow-state.no-creation-time {workflow}", workflow=name
                )
                return
        device = self._device(workflow)
        if device is None:
            self._keep(key, workflow, name)
            return
        self.metrics.ends.inc()
        if self.ends is not None:
            self.ends.workflowFinished(device, name, createdAt)

    def _device(self, workflow: dict[str, Any]) -> str | None:
        found = {self.devices.lookup(i) for i in agentIds(workflow)} - {None}
        if len(found) == 1:
            device: str | None = found.pop()
            return device
        return None

    def _keep(self, key: str, workflow: dict[str, Any], name: str) -> None:
        """
        Try this end again later: its device may not be indexed yet. Told
        later, it carries the Workflow's creation time, so the boot side
        ignores it for a run provisioned after the Workflow was made (a
        device added, and provisioned, only after the end).
        """
        if self._stopped:
            return
        meta = workflow.get("metadata") or {}
        createdAt = parseCreated(meta.get("creationTimestamp"))
        if createdAt is None:
            self.log.warn(
                "tink.workflow-state.no-creation-time {workflow}", workflow=name
            )
            return
        self.log.info("tink.workflow-state.unmapped {workflow}", workflow=name)
        end = _Unmapped(workflow, name, createdAt, self._clock.seconds())
        if key not in self._unmapped and len(self._unmapped) >= MAX_UNMAPPED:
            oldest = next(iter(self._unmapped))
            self._drop(self._unmapped.pop(oldest))
        self._unmapped[key] = end
        if self._retry is None:
            self._retry = self._clock.callLater(RETRY_UNMAPPED, self._retryUnmapped)

    def _drop(self, end: _Unmapped) -> None:
        self.log.warn(
            "tink.workflow-state.unmapped-dropped {workflow}: its agent ids map"
            " to no one device",
            workflow=end.name,
        )

    def _retryUnmapped(self) -> None:
        self._retry = None
        if self._stopped:
            return
        now = self._clock.seconds()
        for key, end in list(self._unmapped.items()):
            device = self._device(end.workflow)
            if device is not None:
                del self._unmapped[key]
                self.metrics.ends.inc()
                try:
                    if self.ends is not None:
                        self.ends.workflowFinished(device, end.name, end.createdAt)
                except Exception:
                    _log.failure("tink.workflow-state.bug")
            elif now - end.since >= UNMAPPED_FOR:
                del self._unmapped[key]
                self._drop(end)
        if self._unmapped:
            self._retry = self._clock.callLater(RETRY_UNMAPPED, self._retryUnmapped)
