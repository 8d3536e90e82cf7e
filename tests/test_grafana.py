"""
The Grafana dashboard (conf/grafana/fleetd.json, issue 20, item 6): an
importable dashboard whose every query names metrics, and labels, that a
real fleetd exports.

How the exported metrics are found: one real daemon is started (as the
other daemon tests do) with every optional subsystem configured, since
some metrics exist only then: C{[netbox]} against the loopback fake NetBox
(L{FakeNetBox}, as tests/test_netbox_daemon.py), C{[kubernetes]} against
the fake API over loopback TLS (L{FakeKube}, as tests/test_kube_tls.py),
and C{tink.workflow_state = "kubernetes"}. Its admin listener's C{/metrics}
is parsed with prometheus_client's own parser; a name is exported when a
sample carries it or when a family declares it (a counter family C{x} is
C{x_total} and C{x_created}) -- a labelled metric with no child yet has
no samples but is still described.

Labels: a query may filter or group a metric by C{job} and C{instance}
(Prometheus adds them), by the labels its exported samples carry, or, for
a metric with no samples yet, by the C{labelnames} its prometheus_client
C{Counter}/C{Gauge} declares in the daemon's registry. A custom collector's
metric with no samples (the per-device alert gauges, DNS rate limiting)
has no label the test can see, so the dashboard filters those by C{job}
and C{instance} only. The check is deliberately coarse: every label an
expression names must exist on every metric that expression names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.ssl import PrivateCertificate
from twisted.trial.unittest import TestCase
from twisted.web.server import Site

from fleetd.service import FleetdService
from fleetd.testing.kube import FakeKube
from fleetd.testing.netbox import FakeNetBox
from tests.daemonsupport import DaemonTestMixin
from tests.netbox_support import TOKEN
from tests.support import REPO
from tests.test_kube_tls import selfSigned

DASHBOARD = REPO / "conf" / "grafana" / "fleetd.json"

# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = {"job", "instance"}

# PromQL words that are not metric names: aggregations and functions used
# without a parenthesis right after them, binary and set operators,
# modifiers.
KEYWORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk",
    "bottomk", "quantile", "count_values", "group", "by", "without", "on",
    "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "atan2", "inf", "nan",
}  # fmt: skip

# Words after which a parenthesised list names labels.
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}

TOKEN_RE = re.compile(
    r"""
      (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    | (?P<range>\[[^\]]*\])
    | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[a-zA-Z]*)
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>=~|!~|!=|==|>=|<=|[=<>])
    | (?P<space>\s+)
    | (?P<other>.)
    """,
    re.VERBOSE,
)


def parseExpr(expr: str) -> tuple[set[str], set[str]]:
    """
    The metric names and the label names one PromQL expression names.

    An identifier is a metric name unless it is a keyword, a function (a
    parenthesis follows), inside C{{...}} (label matchers: the identifier
    before the operator is a label) or inside the label list after C{by},
    C{without}, C{on}, C{ignoring}, C{group_left} or C{group_right}.
    Strings and range or subquery brackets are skipped whole.
    """
    tokens = [
        (m.lastgroup, m.group())
        for m in TOKEN_RE.finditer(expr)
        if m.lastgroup != "space"
    ]
    metrics: set[str] = set()
    labels: set[str] = set()
    inBraces = False
    labelList = 0  # parenthesis depth of a by/without/on/... list, 0 outside
    previous: str | None = None
    for index, (kind, text) in enumerate(tokens):
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if text == "{":
            inBraces = True
        elif text == "}":
            inBraces = False
        elif labelList:
            if text == "(":
                labelList += 1
            elif text == ")":
                labelList -= 1
            elif kind == "ident":
                labels.add(text)
        elif text == "(" and previous in LABEL_LISTS:
            labelList = 1
        elif kind == "ident":
            if inBraces:
                if following in {"=", "!=", "=~", "!~"}:
                    labels.add(text)
            elif text in KEYWORDS or following == "(":
                pass
            else:
                metrics.add(text)
        previous = text
    return metrics, labels


def loadDashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def queryPanels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries, rows' nested panels included."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def exported(body: str) -> dict[str, set[str]]:
    """Every exported metric name, with the labels its samples carry."""
    names: dict[str, set[str]] = {}
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
        "info": ("_info",),
    }
    for family in text_string_to_metric_families(body):
        for suffix in suffixes.get(family.type, ("",)):
            names.setdefault(family.name + suffix, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def declaredLabels(service: FleetdService) -> dict[str, set[str]]:
    """The labelnames of the registry's prometheus_client metrics, by name."""
    declared: dict[str, set[str]] = {}
    mapping: dict[Any, list[str]] = service.registry._collector_to_names
    for collector, names in mapping.items():
        labelnames = getattr(collector, "_labelnames", None)
        if labelnames is None:
            continue
        for name in names:
            declared.setdefault(name, set()).update(labelnames)
    return declared


class ParseExprTests(TestCase):
    """The small PromQL reader the dashboard test relies on."""

    def test_metricsAndLabels(self) -> None:
        metrics, labels = parseExpr(
            'max by (instance, listener) (a_b{job="fleetd",x=~"$y"})'
            " / on (instance, listener) max by (instance, listener)"
            ' (c:d{z!="w"}) > 0.9'
        )
        self.assertEqual(metrics, {"a_b", "c:d"})
        self.assertEqual(labels, {"instance", "listener", "job", "x", "z"})

    def test_functionsRangesStrings(self) -> None:
        metrics, labels = parseExpr(
            'time() - sum(rate(m_total{l="rate(n)"}[$__rate_interval]))'
            " or vector(0) + histogram_quantile(0.9, sum by (le) (h_bucket[5m]))"
        )
        self.assertEqual(metrics, {"m_total", "h_bucket"})
        self.assertEqual(labels, {"l", "le"})


class DashboardTests(DaemonTestMixin, TestCase):
    timeout = 60

    def test_importable(self) -> None:
        """A dashboard Grafana imports as it is: its own data source variable."""
        dashboard = loadDashboard()
        self.assertEqual(dashboard["title"], "fleetd")
        self.assertRegex(dashboard["uid"], r"^[a-zA-Z0-9_-]{1,40}$")
        self.assertIsInstance(dashboard["schemaVersion"], int)
        self.assertNotIn("id", dashboard)  # imports beside anything
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        panels = queryPanels(dashboard)
        self.assertTrue(panels)
        ids = [p["id"] for p in dashboard["panels"]]
        self.assertEqual(len(ids), len(set(ids)))
        for panel in panels:
            self.assertIn(panel["type"], {"timeseries", "stat"}, panel["title"])
            self.assertEqual(panel["datasource"]["uid"], "${datasource}")
            self.assertTrue(panel["targets"], panel["title"])
            for target in panel["targets"]:
                self.assertEqual(target["datasource"]["uid"], "${datasource}")
                self.assertIn('job="fleetd"', target["expr"], panel["title"])
                metrics, _ = parseExpr(target["expr"])
                self.assertTrue(metrics, target["expr"])

    def test_issue27Series_shown(self) -> None:
        """
        Certificate expiry, devices by status and the longest-staged node
        (issue 27, item 8) each have a panel.
        """
        shown: set[str] = set()
        for panel in queryPanels(loadDashboard()):
            for target in panel["targets"]:
                shown |= parseExpr(target["expr"])[0]
        wanted = {
            "fleetd_certificate_not_after_seconds",
            "fleetd_devices",
            "fleetd_staged_longest_seconds",
        }
        self.assertEqual(wanted - shown, set())

    async def test_queriesNameExportedMetrics(self) -> None:
        """Every metric and label a panel's query names, a real fleetd exports."""
        service = await self.startWithEverything()
        _, _, body = await self.get(service, "admin", "/metrics")
        names = exported(body.decode())
        declared = declaredLabels(service)
        self.assertIn("fleetd_netbox_pushes_total", names)  # [netbox] is on
        self.assertIn("fleetd_kube_rbac_check_success", names)  # [kubernetes] too
        problems = []
        for panel in queryPanels(loadDashboard()):
            for target in panel["targets"]:
                metrics, labels = parseExpr(target["expr"])
                for metric in sorted(metrics):
                    if metric not in names:
                        problems.append(f"{panel['title']}: {metric} is not exported")
                        continue
                    known = TARGET_LABELS | names[metric] | declared.get(metric, set())
                    for label in sorted(labels - known):
                        problems.append(f"{panel['title']}: {metric} has no {label}")
        self.assertEqual(problems, [])

    async def startWithEverything(self) -> FleetdService:
        """A daemon with [netbox], [kubernetes] and the Workflow watch."""
        netbox = FakeNetBox()
        nbPort: Any = await TCP4ServerEndpoint(
            reactor, 0, interface="127.0.0.1"
        ).listen(Site(netbox))
        self.addCleanup(nbPort.stopListening)
        files = Path(self.mktemp()).resolve()
        files.mkdir()
        (files / "netbox-token").write_text(TOKEN)
        cert, key = selfSigned(files, "server")
        kube = FakeKube(reactor)
        options = PrivateCertificate.loadPEM(cert.read_bytes() + key.read_bytes())
        kubePort = reactor.listenSSL(  # type: ignore[attr-defined]
            0, Site(kube.resource()), options.options(), interface="127.0.0.1"
        )
        self.addCleanup(kubePort.stopListening)
        self.addCleanup(kube.closeWatches)
        (files / "kube-token").write_text(kube.adminToken + "\n")
        self.makeSettings(
            {
                "netbox": {
                    "url": f"http://127.0.0.1:{nbPort.getHost().port}/",
                    "token_file": str(files / "netbox-token"),
                },
                "kubernetes": {
                    "api": f"https://127.0.0.1:{kubePort.getHost().port}",
                    "ca": str(cert),
                    "token_file": str(files / "kube-token"),
                },
                "tink": {
                    "upstream": "tcp:127.0.0.1:1",
                    "workflow_state": "kubernetes",
                    "workflow_namespace": "tink",
                },
            }
        )
        service = self.startDaemon()
        await service.loading.whenReady()
        return service
