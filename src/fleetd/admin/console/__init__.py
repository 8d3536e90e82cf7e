"""
The owner console: server-rendered pages on the admin listener (design.md
and docs/operations.md, "Console").

  - L{fleetd.admin.console.sessions}: one-time login links and sessions;
  - L{fleetd.admin.console.gate}: who may enter (the owner certificate or
    a session), the CSRF check of every form, the security headers;
  - L{fleetd.admin.console.page}: the Jinja2 templates and the async
    rendering of a page;
  - one module per page: the fleet view C{/}, a device C{/devices/NAME},
    the verification page C{/device}, the journal C{/journal}.

Every page reads through the services the owner API reads through, and
every change goes through the same code and journal as fleetctl's, with
the same owner actor and C{via=console}.
"""
