"""
Certificates and keys: the LDevID issuer, the trust bundle [T4] and the
development PKI generated on a dev machine's first run (L{fleetd.pki.dev}).
"""
