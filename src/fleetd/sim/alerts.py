"""
Which alerts fleetd's own rules raise, read from fleetd (docs/design.md,
the rack simulator's faults: a fault's outcome is checked from the
journal, the metrics and the alert rules, never from the sim's beliefs).

L{scrape} reads C{GET /metrics} on the admin listener with the owner's
certificate, as Prometheus would. L{firing} holds every scraped series at
its value for the rules' longest C{for:} (plus one evaluation) as a
C{promtool test rules} input against C{conf/alerts.yml}, expecting no
alert at the end: promtool lists, per alert name, the alerts that fire
instead, which is the answer. A series a rule needs to change (a rate)
is therefore flat, as it would be in a scrape of a quiet fleetd.

Blocking (http.client, promtool): the rack runs L{alertsOf} in a thread.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

from fleetd.sim.daemon import Fleetd

RULES = Path(__file__).resolve().parents[3] / "conf" / "alerts.yml"
JOB = "fleetd"
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_UNIT["y"] = 365 * _UNIT["d"]
_GOT = re.compile(r"^\s*Labels:\{(.*)\}\s*$", re.MULTILINE)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class AlertsError(Exception):
    """The scrape or promtool failed (one line, or promtool's output)."""


@dataclass(frozen=True)
class Sample:
    """One scraped series and its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Firing:
    """One alert promtool says fires, with its labels."""

    name: str
    labels: tuple[tuple[str, str], ...]

    @property
    def device(self) -> str | None:
        return dict(self.labels).get("device")


def scrape(fleetd: Fleetd, timeout: float = 10) -> str:
    """fleetd's C{/metrics} text, over the admin listener as the owner."""
    pki = fleetd.pki
    context = ssl.create_default_context(cafile=str(pki.public_ca))
    context.load_cert_chain(str(pki.owner_cert), str(pki.owner_key))
    host, _, port = fleetd.admin.removeprefix("https://").partition(":")
    conn = http.client.HTTPSConnection(
        host, int(port or 443), context=context, timeout=timeout
    )
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as e:
        raise AlertsError(f"scrape {fleetd.admin}/metrics: {e}") from e
    finally:
        conn.close()
    if response.status != 200:
        raise AlertsError(f"scrape {fleetd.admin}/metrics: HTTP {response.status}")
    return body.decode()


def samples(text: str) -> list[Sample]:
    """The finite-valued series of a Prometheus text exposition."""
    found = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if math.isfinite(s.value):
                labels = tuple(sorted(s.labels.items()))
                found.append(Sample(s.name, labels, float(s.value)))
    return found


def seconds(duration: str) -> float:
    """A Prometheus duration (C{1h30m}) in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise AlertsError(f"not a duration: {duration!r}")
    return sum(int(n) * _UNIT[u] for n, u in parts)


def ruleSet(rules: Path) -> tuple[list[str], int]:
    """The alert names of C{rules} and how many minutes a series must be
    held for every one of them to fire: the longest C{for:}, plus one."""
    document: dict[str, Any] = yaml.safe_load(rules.read_text())
    names: list[str] = []
    longest = 0.0
    for group in document.get("groups", []):
        for rule in group.get("rules", []):
            if "alert" in rule:
                names.append(str(rule["alert"]))
                longest = max(longest, seconds(str(rule.get("for", "0s"))))
    return names, math.ceil(longest / 60) + 1


def selector(sample: Sample, instance: str) -> str:
    """C{name{labels}} with the labels a scrape of C{instance} adds."""
    labels = dict(sample.labels)
    labels.update(job=JOB, instance=instance)
    inner = ", ".join(
        f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(labels.items())
    )
    return f"{sample.name}{{{inner}}}"


def rulesTest(scraped: list[Sample], rules: Path, instance: str) -> dict[str, Any]:
    """The C{promtool test rules} document: every series held, every alert
    of C{rules} expected silent at the end."""
    names, minutes = ruleSet(rules)
    up = Sample("up", (), 1.0)  # the scrape itself succeeded
    held = [
        {"series": selector(s, instance), "values": _held(s.value, minutes)}
        for s in [up, *scraped]
    ]
    end = f"{minutes}m"
    return {
        "rule_files": [str(rules.resolve())],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": held,
                "alert_rule_test": [
                    {"eval_time": end, "alertname": n, "exp_alerts": []} for n in names
                ],
            }
        ],
    }


def parseFiring(output: str) -> list[Firing]:
    """The alerts a failed C{promtool test rules} run says it got."""
    found = []
    for line in _GOT.findall(output):
        labels = dict((k, _unquote(v)) for k, v in _LABEL.findall(line))
        name = labels.pop("alertname", None)
        if name is not None:
            found.append(Firing(name, tuple(sorted(labels.items()))))
    return found


def firing(
    text: str,
    *,
    rules: Path = RULES,
    instance: str = "fleetd",
    promtool: str = "promtool",
) -> list[Firing]:
    """
    The alerts of C{rules} that fire on the scraped C{text} held for
    their C{for:}.

    @raise AlertsError: promtool is missing, or failed for another reason
        than alerts firing.
    """
    program = shutil.which(promtool)
    if program is None:
        raise AlertsError(f"{promtool} not found (prometheus' promtool)")
    document = rulesTest(samples(text), rules, instance)
    with tempfile.TemporaryDirectory(prefix="fleetd-sim-alerts-") as directory:
        path = Path(directory) / "scraped_test.yml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        done = subprocess.run(
            [program, "test", "rules", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    output = done.stdout + done.stderr
    if done.returncode == 0:
        return []
    found = parseFiring(output)
    if not found:
        raise AlertsError(f"promtool test rules: {output.strip()[-2000:]}")
    return found


def alertsOf(fleetd: Fleetd) -> Deferred[list[Firing]]:
    """The alerts fleetd's rules raise on a scrape of it now (in a thread)."""
    instance = fleetd.admin.removeprefix("https://")
    return deferToThread(lambda: firing(scrape(fleetd), instance=instance))


def _held(value: float, minutes: int) -> str:
    """C{value} at every minute from 0 to C{minutes} (spelled out: an
    exponent's sign would read as promtool's C{a+bxn} notation)."""
    return " ".join([format(value, ".17g")] * (minutes + 1))


def _unquote(value: str) -> str:
    """A Go-quoted label value (C{\\"}, C{\\\\}, C{\\n}) as text."""
    try:
        text: str = json.loads(f'"{value}"')
    except ValueError:
        return value
    return text
