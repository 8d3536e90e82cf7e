"""TPM 2.0 attestation, LDevID issuance and the device listener's lookups."""
