"""
HTTP/2 and gRPC mechanics, beneath the Tinkerbell semantics of
L{fleetd.tink}, which import down into them (never the reverse).

The server side (L{fleetd.h2.listener}, L{fleetd.h2.server},
L{fleetd.h2.stream}, with abuse limits in L{fleetd.h2.guard} and
L{fleetd.h2.calm}, stall deadlines in L{fleetd.h2.deadlines}), the
upstream client side (L{fleetd.h2.upstream}, L{fleetd.h2.client}), the
proxy joining them (L{fleetd.h2.proxy}), what both hops share
(L{fleetd.h2.conn}, L{fleetd.h2.memo}), gRPC's wire details
(L{fleetd.h2.grpcwire}) and the counters the proxy needs
(L{fleetd.h2.metrics}).
"""
