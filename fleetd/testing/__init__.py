"""Reusable strict fakes of fleetd's peers, for tests (see each module)."""
