"""
Render a node's Talos machine configuration from its cluster's template.

Templates are YAML documents (C{<templates>/<cluster>.yaml}); the first
document of C{version: v1alpha1} is patched per node, other documents
(HostnameConfig, network documents, ...) pass through unchanged. A
template holding an unfilled placeholder (L{fleetd.runs.placeholders}) is
refused, unless the renderer was given development values to fill them.
A device of a class that opts in to disk encryption by fleetd's KMS gets
the section where the template's marker is (L{fleetd.runs.diskencryption}).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetd.runs.diskencryption import DiskEncryption, Place, place, placeOf
from fleetd.runs.diskencryption import problemLine as _problemLine
from fleetd.runs.placeholders import DevValues, findPlaceholder

# libyaml when PyYAML was built with it: ~10x faster on large documents.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_CLUSTER = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class RenderError(Exception):
    """A template is missing or unusable; the message is one line."""


@dataclass(frozen=True)
class NodeFacts:
    """What the renderer needs to know about one node."""

    name: str
    device_class: str
    run: str
    install_disk: str | None = None
    bootstrap_token: str | None = None


def _documents(path: Path, values: DevValues | None) -> list[Any]:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError as e:
        raise RenderError(f"no template {path.name} in {path.parent}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise RenderError(f"cannot read template {path}: {e}") from e
    try:
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as e:
        raise RenderError(f"template {path.name} is not valid YAML") from e
    if not docs:
        raise RenderError(f"template {path.name} is empty")
    if values is not None:
        return [values.fill(d) for d in docs]
    placeholder = findPlaceholder(text, path, _Loader)
    if placeholder is not None:
        raise RenderError(str(placeholder))
    return docs


def _machineDocument(docs: list[Any], name: str) -> dict[str, Any]:
    for doc in docs:
        if isinstance(doc, dict) and doc.get("version") == "v1alpha1":
            return doc
    raise RenderError(f"template {name} has no v1alpha1 document")


def _table(doc: dict[str, Any], *keys: str) -> dict[str, Any]:
    for key in keys:
        child = doc.get(key)
        if child is None:
            child = doc[key] = {}
        if not isinstance(child, dict):
            raise RenderError(f"template field {'.'.join(keys)} is not a mapping")
        doc = child
    return doc


class TemplateRenderer:
    """
    Render configurations from the templates in C{directory}; with
    C{values} (development only), placeholders are filled from them
    instead of refused; with C{diskEncryption}, devices of the classes
    it names get fleetd's KMS section where the template's marker is.
    """

    def __init__(
        self,
        directory: Path,
        defaultCluster: str = "default",
        values: DevValues | None = None,
        diskEncryption: DiskEncryption | None = None,
    ) -> None:
        self.directory = directory
        self.defaultCluster = defaultCluster
        self._values = values
        self.diskEncryption = diskEncryption
        # Parsed templates by path, kept while the file's mtime and size
        # hold, with where they can take the disk-encryption section.
        self._cache: dict[Path, tuple[tuple[int, int], list[Any], Place]] = {}

    def _parsed(self, path: Path) -> tuple[list[Any], Place]:
        """C{path}'s documents, parsed and checked once per change of the file."""
        try:
            st = path.stat()
        except OSError as e:
            raise RenderError(f"no template {path.name} in {path.parent}") from e
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._cache.get(path)
        if cached is None or cached[0] != stamp:
            docs = _documents(path, self._values)
            cached = (stamp, docs, placeOf(docs))
            self._cache[path] = cached
        return cached[1], cached[2]

    def _placeFor(self, path: Path, known: Place, classes: list[str]) -> None:
        """@raise RenderError: C{classes} opt in and the template has no place."""
        if known.refuses(classes):
            raise RenderError(_problemLine(path, known, _Loader, classes))

    def _opting(self, deviceClass: str | None) -> list[str]:
        """The classes to check a template for: C{deviceClass}'s, or all."""
        if self.diskEncryption is None:
            return []
        if deviceClass is None:
            return sorted(self.diskEncryption.classes)
        return [deviceClass] if self.diskEncryption.optsIn(deviceClass) else []

    def templatePath(self, cluster: str | None) -> Path:
        name = cluster or self.defaultCluster
        if not _CLUSTER.match(name):
            raise RenderError(f"bad cluster name {name!r}")
        return self.directory / f"{name}.yaml"

    def clusters(self) -> list[str]:
        """
        The clusters the site defines: one per template C{<cluster>.yaml}
        in the directory, by name; none when it cannot be listed.
        """
        try:
            paths = list(self.directory.glob("*.yaml"))
        except OSError:
            return []
        return sorted(p.stem for p in paths if _CLUSTER.match(p.stem) and p.is_file())

    def check(self, cluster: str | None, deviceClass: str | None = None) -> None:
        """
        Whether C{cluster}'s template can be rendered: read, YAML, not
        empty, no unfilled placeholder, and, for a C{deviceClass} that
        opts in to disk encryption (L{None}: for any class that does), a
        place for the section (a provision asks before it starts anything).

        @raise RenderError: the one line saying why not.
        """
        path = self.templatePath(cluster)
        _, known = self._parsed(path)
        self._placeFor(path, known, self._opting(deviceClass))

    def checkAll(self) -> None:
        """L{check} every cluster's template (at start). @raise RenderError."""
        for cluster in self.clusters():
            self.check(cluster)

    def render(self, cluster: str | None, node: NodeFacts) -> bytes:
        """The node's configuration as multi-document YAML bytes."""
        path = self.templatePath(cluster)
        parsed, known = self._parsed(path)
        opting = self._opting(node.device_class)
        self._placeFor(path, known, opting)
        docs = copy.deepcopy(parsed)
        machine = _machineDocument(docs, path.name)
        encryption = self.diskEncryption
        place(machine, known, encryption.section() if opting and encryption else None)
        _table(machine, "machine", "network")["hostname"] = node.name
        if node.install_disk is not None:
            _table(machine, "machine", "install")["disk"] = node.install_disk
        labels = _table(machine, "machine", "nodeLabels")
        labels.update(
            {
                "fleetd.io/device": node.name,
                "fleetd.io/class": node.device_class,
                "fleetd.io/run": node.run,
            }
        )
        if node.bootstrap_token is not None:
            _table(machine, "cluster")["token"] = node.bootstrap_token
        out: str = yaml.dump_all(
            docs, Dumper=_Dumper, sort_keys=False, explicit_start=True
        )
        return out.encode("utf-8")
