"""
Unfilled placeholders in a Talos template (issue 27, item 3).

The shipped example (C{conf/templates/default.yaml}) marks every value a
site must supply with a placeholder, and docs/install.md says none may
reach a node. A I{placeholder} is the text C{REPLACE-WITH-} followed by
one or more words of capital letters and digits joined by single hyphens
(L{PLACEHOLDER}: C{REPLACE-WITH-TRUSTD-TOKEN}, C{REPLACE-WITH-CLUSTER-CA-CRT}),
found anywhere inside a YAML scalar: a value or a key, of any document
of the template. Comments never reach a node and are not looked at.

A production template holding one is refused, naming the file, the line
and the placeholder (L{findPlaceholder}). A development configuration
(C{[dev] generate_values}) fills each with a value of its own instead
(L{DevValues}): the same value for the same placeholder as long as the
state directory's master key lives, so dev runs look like real ones.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetd.store.keys import deriveKey

PLACEHOLDER = re.compile(r"REPLACE-WITH-[A-Z0-9]+(?:-[A-Z0-9]+)*")
DEV_PURPOSE = "fleetd dev template values v1"
_TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"  # noqa: S105 (letters)


@dataclass(frozen=True)
class Placeholder:
    """
    The first unfilled placeholder of a template: C{text} on line C{line}
    (from 1) of C{path}, and how many there are in all (C{count}).
    """

    path: Path
    line: int
    text: str
    count: int = 1

    def __str__(self) -> str:
        more = f" (and {self.count - 1} more)" if self.count > 1 else ""
        return (
            f"{self.path} line {self.line}: unfilled placeholder {self.text}{more};"
            ' fill the template as docs/install.md, "The Talos template", says'
        )


def _scalars(node: yaml.Node) -> Iterator[yaml.ScalarNode]:
    """Every scalar under C{node} (keys included), each once."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue  # an alias of a node already looked at
        seen.add(id(current))
        if isinstance(current, yaml.ScalarNode):
            yield current
        elif isinstance(current, yaml.MappingNode):
            for key, value in reversed(current.value):
                stack.extend((value, key))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(reversed(current.value))


def findPlaceholder(text: str, path: Path, loader: Any) -> Placeholder | None:
    """
    The first placeholder in the scalars of C{text} (the YAML of C{path},
    composed with C{loader}), or L{None} when it holds none.

    The line is the one in the file where the placeholder is written:
    searched for in the scalar's own source text (a block scalar spans
    lines), else the line the scalar starts on (an escaped spelling).

    @raise yaml.YAMLError: C{text} is not YAML.
    """
    found: list[tuple[int, str]] = []
    for document in yaml.compose_all(text, Loader=loader):
        if document is None:
            continue
        for scalar in _scalars(document):
            names = PLACEHOLDER.findall(scalar.value)
            if not names:
                continue
            start, end = scalar.start_mark, scalar.end_mark
            for name in names:
                at = text.find(name, start.index, max(end.index, start.index + 1))
                line = start.line + 1 if at < 0 else text.count("\n", 0, at) + 1
                found.append((line, name))
    if not found:
        return None
    line, name = min(found)
    return Placeholder(path, line, name, len(found))


class DevValues:
    """
    A value of its own for each placeholder, for development only
    (C{[dev] generate_values}): derived from the state's master key, so
    the same placeholder gets the same value until the state is removed,
    and two checkouts get different ones.

    A placeholder whose name ends in C{-TOKEN} gets the form of a Talos
    trustd token or a Kubernetes bootstrap token (C{[a-z0-9]{6}.[a-z0-9]{16}});
    every other one base64 of 32 bytes, the form of C{cluster.id} and
    C{cluster.secret}. They are stand-ins: no cluster knows them.
    """

    def __init__(self, masterKey: bytes) -> None:
        self._key = deriveKey(masterKey, DEV_PURPOSE)

    def value(self, placeholder: str) -> str:
        """The value that stands in for C{placeholder}."""
        digest = hmac.new(self._key, placeholder.encode(), hashlib.sha256).digest()
        if placeholder.endswith("-TOKEN"):
            letters = "".join(_TOKEN_ALPHABET[b % 36] for b in digest[:22])
            return f"{letters[:6]}.{letters[6:22]}"
        return base64.b64encode(digest).decode("ascii")

    def fill(self, value: Any) -> Any:
        """C{value} (a loaded YAML document) with every placeholder replaced."""
        if isinstance(value, str):
            return PLACEHOLDER.sub(lambda m: self.value(m.group()), value)
        if isinstance(value, dict):
            return {self.fill(k): self.fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.fill(v) for v in value]
        return value
