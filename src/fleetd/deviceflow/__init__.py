"""
The OAuth 2.0 device authorization grant (RFC 8628): its values
(L{fleetd.deviceflow.model}), one request's life (L{fleetd.deviceflow.machine}),
the node's side (L{fleetd.deviceflow.flow}) and the owner's decisions
(L{fleetd.deviceflow.owner}). Its HTTP faces live with the listeners:
C{POST /device/code} and C{/token} in L{fleetd.boot.deviceflow_resource},
the owner's approval in L{fleetd.admin.deviceflow}.
"""
