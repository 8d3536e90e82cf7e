"""
The calls fleetd makes on Tinkerbell's objects (C{tinkerbell.org/v1alpha1}
C{hardware} and C{workflows}, in one namespace), through the C{[kubernetes]}
client: its deadline and its errors (L{fleetd.k8s.errors}).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fleetd.k8s.client import KubeClient, NotFound

GROUP = "/apis/tinkerbell.org/v1alpha1"
PLURALS = ("hardware", "workflows")


class TinkerbellAPI:
    """Get, list, create, replace and delete in one namespace."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    def _path(self, plural: str, name: str | None = None) -> str:
        assert plural in PLURALS
        path = f"{GROUP}/namespaces/{quote(self.namespace)}/{plural}"
        return path if name is None else f"{path}/{quote(name)}"

    async def get(self, plural: str, name: str) -> dict[str, Any] | None:
        """The object, or L{None} when there is none."""
        try:
            found: dict[str, Any] = await self.client.call(
                "GET", self._path(plural, name), f"get {plural} {name}"
            )
        except NotFound:  # (without the CRD too: then create says so)
            return None
        return found

    async def list(self, plural: str) -> list[dict[str, Any]]:
        """Every object of C{plural} in the namespace."""
        doc = await self.client.call("GET", self._path(plural), f"list {plural}")
        return list(doc.get("items") or [])

    async def create(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        made: dict[str, Any] = await self.client.call(
            "POST", self._path(plural), f"create {plural} {name}", body=obj
        )
        return made

    async def replace(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT C{obj}, which carries the C{resourceVersion} it was read at
        (a 409 means it changed since: read it again)."""
        name = obj["metadata"]["name"]
        done: dict[str, Any] = await self.client.call(
            "PUT", self._path(plural, name), f"update {plural} {name}", body=obj
        )
        return done

    async def delete(self, plural: str, name: str, uid: str) -> bool:
        """Delete the object whose uid is C{uid} (a 409 when the name is
        another object's now); L{False} when there was none."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid},
        }
        try:
            await self.client.call(
                "DELETE", self._path(plural, name), f"delete {plural} {name}", options
            )
        except NotFound:
            return False
        return True
