"""
The kms listener (C{listen.kms}, served with C{[kms]}): Talos's
C{sidero.kms.KMSService} over gRPC on the HTTP/2 server of the tink
listener, with its abuse limits (L{fleetd.h2}); each call is answered by
L{fleetd.kms.service.DiskKeys} (L{call}), the listener built and drained
in L{listener}.
"""
