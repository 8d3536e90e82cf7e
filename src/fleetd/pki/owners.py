"""
The operator name rule and the operator roles, shared by the admin
listener's owner check (L{fleetd.web.owner}) and C{fleetd-pki operator}
(L{fleetd.pki.cli}), so a certificate the tool makes is one the listener
reads the same way [O1] [O4].

An operator's name is its certificate's CN; the journal records it as the
actor "<role>:<CN>", so it must fit the journal's actor alphabet
(L{fleetd.store.journal}): letters, digits and C{_ . @ -}, at most 64,
starting with a letter or digit.

An operator's role is fixed in the certificate as one certificate policy
under fleetd's own arc (L{ROLE_ARC}, a UUID arc, ITU-T X.667: no
registration needed): L{OWNER} may do everything, L{READER} may read and
change nothing [O4]. A certificate without a policy under that arc is an
owner: every owner certificate issued before roles existed keeps the
meaning it had (docs/decisions.md, "The operator's role in the
certificate").
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from cryptography import x509

__all__ = [
    "OWNER",
    "OWNER_NAME",
    "OWNER_NAME_RULE",
    "READER",
    "ROLES",
    "ROLE_ARC",
    "RoleError",
    "certificateRole",
    "rolePolicies",
]

OWNER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
OWNER_NAME_RULE = (
    "letters, digits, _ . @ -; at most 64, starting with a letter or digit"
)

OWNER = "owner"
READER = "reader"
ROLES = (OWNER, READER)

# 2.25.<UUID 5b75bdb5-af03-46e7-a7d7-23e09cbe217e as an integer>: fleetd's arc.
ROLE_ARC = "2.25.121571094118752262849479828606346469758"
_POLICY: Mapping[str, x509.ObjectIdentifier] = {
    OWNER: x509.ObjectIdentifier(ROLE_ARC + ".1"),
    READER: x509.ObjectIdentifier(ROLE_ARC + ".2"),
}
_ROLE_OF = {oid.dotted_string: role for role, oid in _POLICY.items()}


class RoleError(ValueError):
    """A certificate whose fleetd role cannot be read: one line saying why."""


def rolePolicies(role: str) -> x509.CertificatePolicies:
    """The certificate policies extension that fixes C{role} in a certificate."""
    if role not in _POLICY:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    return x509.CertificatePolicies([x509.PolicyInformation(_POLICY[role], None)])


def certificateRole(cert: x509.Certificate) -> str:
    """
    The role C{cert} carries [O4]: the one policy under L{ROLE_ARC} among
    its certificate policies, or L{OWNER} when it has none (a certificate
    made before roles; policies of other issuers are not fleetd's and are
    ignored).

    @raise RoleError: the policies cannot be read, name more than one
        fleetd role, or one this fleetd does not know (a role of a later
        version is never taken for an owner).
    """
    try:
        policies = cert.extensions.get_extension_for_class(x509.CertificatePolicies)
    except x509.ExtensionNotFound:
        return OWNER
    except ValueError as e:  # a duplicate or malformed extension
        raise RoleError(f"its extensions cannot be read ({e})") from None
    ours = [
        p.policy_identifier.dotted_string
        for p in policies.value
        if p.policy_identifier.dotted_string.startswith(ROLE_ARC + ".")
    ]
    if not ours:
        return OWNER
    if len(ours) > 1:
        raise RoleError("it names more than one fleetd role")
    role = _ROLE_OF.get(ours[0])
    if role is None:
        raise RoleError(
            f"it names a fleetd role this fleetd does not know ({ours[0]}); "
            f"known: {', '.join(ROLES)}"
        )
    return role
