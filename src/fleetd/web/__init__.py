"""
HTTP helpers below the boot, device and admin listeners.

L{fleetd.web.resources} holds the resource helpers (one-line refusals,
JSON answers, async rendering), L{fleetd.web.site} the bounded site,
L{fleetd.web.refusals} the one refusal mapping every listener uses,
L{fleetd.web.owner} the owner-certificate check and L{fleetd.web.peer}
the client certificate TLS verified.
"""
