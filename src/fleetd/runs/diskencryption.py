"""
Disk encryption by fleetd's KMS in a class's configuration (issue 30).

A class with C{disk_encryption = "kms"} (C{[provision.class.<name>]})
gets, in its rendered configuration, Talos's
C{machine.systemDiskEncryption} for STATE and EPHEMERAL: LUKS2, one key in
slot 0 sealed by the KMS at C{https://<enrollment name>:<kms port>}. The
template says where: its v1alpha1 document holds the marker

    machine:
      systemDiskEncryption: FLEETD-KMS

which becomes the section for a device of an opting-in class and goes
away for any other (so a plain class renders exactly as the same template
without the marker line). A template without the marker, with a
C{systemDiskEncryption} of its own, with a C{VolumeConfig} of STATE or
EPHEMERAL that sets its own encryption (Talos refuses both at once), or
with the marker anywhere else, has no place for it: a class that opts in
is refused with it (L{Place.problem}), at start and at each provision,
naming the file and the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from twisted.internet.interfaces import IListeningPort

MARKER = "FLEETD-KMS"
KEY = "systemDiskEncryption"
PARTITIONS = ("state", "ephemeral")  # machine.systemDiskEncryption's keys
_VOLUMES = ("STATE", "EPHEMERAL")  # the same, as VolumeConfig names them


class DiskEncryption:
    """
    The classes whose configurations carry fleetd's KMS key, and where
    nodes reach the KMS: the enrollment name (the public certificate
    covers it; Talos verifies the name of its endpoint) and the C{kms}
    listener's port.
    """

    def __init__(self, classes: Iterable[str], enrollmentName: str, port: int) -> None:
        self.classes = frozenset(classes)
        self.enrollmentName = enrollmentName
        self.port = port

    def optsIn(self, deviceClass: str) -> bool:
        return deviceClass in self.classes

    @property
    def endpoint(self) -> str:
        """C{https://NAME:PORT}: TLS, as Talos reads an C{https} endpoint."""
        return f"https://{self.enrollmentName}:{self.port}"

    def bound(self, port: IListeningPort) -> None:
        """Follow the C{kms} listener's bound port (C{tcp:0} in tests)."""
        number = getattr(port.getHost(), "port", None)
        if isinstance(number, int):
            self.port = number

    def section(self) -> dict[str, Any]:
        """C{machine.systemDiskEncryption} for STATE and EPHEMERAL."""

        def partition() -> dict[str, Any]:
            key = {"slot": 0, "kms": {"endpoint": self.endpoint}}
            return {"provider": "luks2", "keys": [key]}

        # One mapping each: a shared one would be dumped as a YAML alias.
        return {name: partition() for name in PARTITIONS}


@dataclass(frozen=True)
class Place:
    """
    Where a template can take the section: C{problem} is why it cannot
    (L{None}: the marker is in place), C{where} the path of keys to the
    line that error names (in the v1alpha1 document, or a VolumeConfig's).
    """

    problem: str | None
    where: tuple[Any, ...] = ()
    marked: bool = False  # the marker is in place (drop it for a plain class)
    misplaced: bool = False  # the marker elsewhere: refused for every class

    def refuses(self, classes: Iterable[str]) -> bool:
        """Whether the template is refused for devices of C{classes}."""
        return self.misplaced or (self.problem is not None and any(classes))


def _scalars(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The key path of every scalar equal to L{MARKER} under C{value}."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == MARKER:
                yield (*path, k)
            yield from _scalars(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _scalars(v, (*path, i))
    elif value == MARKER:
        yield path


def placeOf(docs: list[Any]) -> Place:
    """Whether the template's documents have the place, and if not why."""
    machineDoc: tuple[int, dict[str, Any]] | None = None
    for n, doc in enumerate(docs):
        if not isinstance(doc, dict):
            continue
        if machineDoc is None and doc.get("version") == "v1alpha1":
            machineDoc = (n, doc)
        elif doc.get("kind") == "VolumeConfig" and doc.get("name") in _VOLUMES:
            if doc.get("encryption") is not None:
                return Place(
                    f"the VolumeConfig of {doc['name']} sets its own encryption,"
                    f" which Talos refuses beside machine.{KEY}",
                    (n, "encryption"),
                )
    if machineDoc is None:
        return Place("no v1alpha1 document")
    n, doc = machineDoc
    machine = doc.get("machine")
    value = machine.get(KEY) if isinstance(machine, dict) else None
    for i, other in enumerate(docs):
        for where in _scalars(other):
            if (i, *where) != (n, "machine", KEY):
                return Place(
                    f"{MARKER} is out of place: only machine.{KEY} may hold it",
                    (i, *where),
                    misplaced=True,
                )
    if value == MARKER:
        return Place(None, marked=True)
    if value is not None:
        return Place(
            f"machine.{KEY} is the template's own; for a class with"
            f' disk_encryption = "kms" it must read {MARKER}',
            (n, "machine", KEY),
        )
    return Place(
        f"no place for disk encryption: put `{KEY}: {MARKER}` under machine:"
        " where fleetd is to write the section",
        (n, "machine") if isinstance(machine, dict) else (n,),
    )


def lineOf(text: str, where: tuple[Any, ...], loader: Any) -> int:
    """
    The line (from 1) of the node at key path C{where} (a document's
    index first) in the YAML C{text}: its key's line, else the deepest
    node on the path that exists.
    """
    nodes = [d for d in yaml.compose_all(text, Loader=loader) if d is not None]
    if not where or where[0] >= len(nodes):
        return 1
    node: yaml.Node = nodes[where[0]]
    line = node.start_mark.line + 1
    for step in where[1:]:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(step):
                    line, child = k.start_mark.line + 1, v
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int):
            if step < len(node.value):
                child = node.value[step]
                line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


def place(machine: dict[str, Any], known: Place, section: Any) -> None:
    """
    Write C{section} (L{None}: none) where the marker is in C{machine},
    the copy of the template's v1alpha1 document being rendered.
    """
    if not known.marked:
        return  # nothing of fleetd's in this template
    table = machine["machine"]
    if section is None:
        del table[KEY]
    else:
        table[KEY] = section


def problemLine(path: Path, known: Place, loader: Any, classes: Iterable[str]) -> str:
    """The one line refusing C{classes}' disk encryption with this template."""
    try:
        line = lineOf(path.read_text("utf-8"), known.where, loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        line = 1
    names = ", ".join(sorted(classes))
    why = f' (class {names} has disk_encryption = "kms")' if names else ""
    return f"{path} line {line}: {known.problem}{why}"
