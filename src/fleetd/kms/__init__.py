"""
Disk keys: fleetd as the site's Talos KMS (issue 30; design.md, "Disk keys").

The keys and their bytes (L{blob}), their rows (L{store}), who may ask
(L{access}), Seal and Unseal (L{service}), why a call is refused and what
is counted (L{reasons}, L{throttle}), and the keys' end at retirement and
at start (L{retire}). Its gRPC face is the kms listener's
(L{fleetd.kmsgrpc}); the wire messages are in L{fleetd.kms.proto}.
"""
