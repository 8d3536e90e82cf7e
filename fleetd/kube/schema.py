"""Schema migrations 9 and 10 (see L{fleetd.kube.store}); no imports."""

MIGRATION_9 = """
CREATE TABLE kube_tokens (
    token_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('node', 'cluster')),
    device TEXT,
    run TEXT,
    created_at REAL NOT NULL,
    expires_at REAL,
    approved_at REAL,
    csr TEXT,
    delete_at REAL,
    deleted_at REAL,
    sealed BLOB
) STRICT;
CREATE INDEX kube_tokens_by_device ON kube_tokens (device, created_at);
CREATE TABLE kube_kubelets (
    device TEXT PRIMARY KEY,
    first_approved_at REAL,
    last_csr TEXT,
    last_approved_at REAL,
    not_after REAL,
    retired_at REAL
) STRICT;
"""

MIGRATION_10 = """
CREATE TABLE cluster_token_requests (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    reason TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    requested_at REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'used')),
    decided_by TEXT,
    decided_at REAL,
    token_id TEXT,
    csr TEXT
) STRICT;
"""
