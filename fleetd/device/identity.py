"""
Who a request on the device listener comes from.

The integrator reconciles this file with the disk-identity branch, which
defines the same dataclass and the C{identify} protocol.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeIdentity:
    device: str
    serial: str
