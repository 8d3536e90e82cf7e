"""The DNS fallback responder for the enrollment name [A5]."""
