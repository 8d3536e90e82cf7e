"""
What fleetd's stream listeners share: TLS policy (L{fleetd.listen.tls}),
connection policy (L{fleetd.listen.connections}), each listener's policy
(L{fleetd.listen.policy}: body limits, the client CA it trusts) and the
service that binds one (L{fleetd.listen.service}).
"""
