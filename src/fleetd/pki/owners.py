"""
The owner name rule, shared by the admin listener's owner check
(L{fleetd.web.owner}) and C{fleetd-pki operator} (L{fleetd.pki.cli}), so a
certificate the tool makes is one the listener accepts [O1].

An owner's name is its certificate's CN; the journal records it as the
actor "owner:<CN>", so it must fit the journal's actor alphabet
(L{fleetd.store.journal}): letters, digits and C{_ . @ -}, at most 64,
starting with a letter or digit.
"""

from __future__ import annotations

import re

__all__ = ["OWNER_NAME", "OWNER_NAME_RULE"]

OWNER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
OWNER_NAME_RULE = (
    "letters, digits, _ . @ -; at most 64, starting with a letter or digit"
)
