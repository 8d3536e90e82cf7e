"""The device listener: attestation, lookups, renewal, disk check [A3]."""
