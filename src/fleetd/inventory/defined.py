"""
What the site defines, for a device to be added: its class must be one
the configuration lists (C{provision.classes}) and its cluster, when it
names one, must have a template (C{<cluster>.yaml} in
C{provision.templates}). A mistake is one L{InventoryError} line saying
which, with a did-you-mean hint (issue 19 item 4).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fleetd.inventory.model import Device, InventoryError

SHOWN = 8  # names listed when nothing is close


def _hint(value: str, known: Sequence[str]) -> str:
    """C{(did you mean X?)}, else the names there are (a few), else nothing."""
    close = difflib.get_close_matches(value, known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]}?)"
    if not known:
        return ""
    more = ", ..." if len(known) > SHOWN else ""
    return f" (defined: {', '.join(known[:SHOWN])}{more})"


@dataclass(frozen=True)
class SiteDefinitions:
    """
    The classes and clusters a device may name.

    @ivar classes: from the configuration, fixed while fleetd runs.
    @ivar clusters: the clusters whose templates are present now (a
        template added without a restart counts at once).
    @ivar templates: where the templates are, for the error line.
    """

    classes: Sequence[str]
    clusters: Callable[[], Iterable[str]]
    templates: str

    def check(self, device: Device) -> None:
        """
        @raise InventoryError: (C{"invalid"}) the class or cluster is not
            one the site defines.
        """
        self._check(device, lambda: sorted(self.clusters()))

    def checkAll(self, devices: Iterable[Device]) -> None:
        """L{check} each of C{devices}; the line names the device."""
        present = functools.cache(lambda: sorted(self.clusters()))
        for device in devices:
            try:
                self._check(device, present)
            except InventoryError as e:
                raise InventoryError(f"{device.name}: {e}") from None

    def _check(self, device: Device, present: Callable[[], list[str]]) -> None:
        classes = sorted(self.classes)
        if device.device_class not in classes:
            if not classes:
                raise InventoryError(
                    f"class: {device.device_class} is not defined: this site"
                    " defines no classes (provision.classes)"
                )
            raise InventoryError(
                f"class: {device.device_class} is not a class this site defines"
                + _hint(device.device_class, classes)
            )
        if device.cluster is None:
            return
        clusters = present()
        if device.cluster not in clusters:
            raise InventoryError(
                f"cluster: {device.cluster} is not a cluster this site defines"
                f" (no template {device.cluster}.yaml in {self.templates})"
                + _hint(device.cluster, clusters)
            )
