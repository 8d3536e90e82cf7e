"""
The device listener's resource tree [A3].

Attestation, install-plan lookups, LDevID renewal and the disk check land
here with the machine-trust issue; until then every path is a one-line 404.
"""

from __future__ import annotations

from fleetd.web import Router


def deviceRoot() -> Router:
    return Router()
