"""
Every schema migration, in one ordered list (the store imports nothing
from the subsystems whose tables these are).

C{PRAGMA user_version} records the last migration a database has run: a
shipped migration's number and SQL never change.
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        ) STRICT;
        CREATE TABLE journal (
            seq INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            event TEXT NOT NULL,
            actor TEXT NOT NULL,
            device TEXT,
            run TEXT,
            fields TEXT NOT NULL,
            digest TEXT NOT NULL
        ) STRICT;
        CREATE INDEX journal_by_device ON journal (device, seq);
        CREATE INDEX journal_by_run ON journal (run, seq);
        CREATE TABLE journal_head (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            seq INTEGER NOT NULL,
            digest TEXT NOT NULL,
            mac TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        2,
        # The embedded inventory (fleetd.inventory.sqlite).  Serials are
        # unique case-insensitively, as NetBox looks them up (iexact).
        """
        CREATE TABLE devices (
            name TEXT PRIMARY KEY,
            serial TEXT NOT NULL COLLATE NOCASE UNIQUE,
            uuid TEXT NOT NULL UNIQUE,
            class TEXT NOT NULL,
            cluster TEXT,
            status TEXT NOT NULL,
            desired_action TEXT
        ) STRICT;
        CREATE TABLE device_macs (
            mac TEXT PRIMARY KEY,
            device TEXT NOT NULL REFERENCES devices (name) ON DELETE CASCADE,
            position INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX device_macs_by_device ON device_macs (device, position);
        CREATE TABLE served_records (
            run TEXT PRIMARY KEY,
            device TEXT NOT NULL REFERENCES devices (name),
            served_at REAL NOT NULL,
            peer TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        3,
        # Provision runs (fleetd.runs.store): keyed digests of codes, never
        # the codes; the configurations themselves live in the vault.
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            device TEXT NOT NULL,
            digest TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL,
            desired_action TEXT,
            superseded_by TEXT,
            missing_noted INTEGER NOT NULL DEFAULT 0,
            refetch_noted INTEGER NOT NULL DEFAULT 0
        ) STRICT;
        CREATE INDEX runs_by_device ON runs (device, created_at);
        """,
    ),
    (
        4,
        # Alert series that must survive a restart [V6]: when a device's
        # node first and last asked for a lost or consumed configuration.
        """
        CREATE TABLE alerts (
            device TEXT NOT NULL,
            kind TEXT NOT NULL,
            first_at REAL NOT NULL,
            last_at REAL NOT NULL,
            PRIMARY KEY (device, kind)
        ) STRICT;
        CREATE INDEX runs_current ON runs (superseded_by, device);
        """,
    ),
    (
        5,
        # Machine trust (fleetd.trust): evidence tying chassis serials to EK
        # digests, and the owner's approved EK bindings [T1].  Evidence is
        # withdrawn, never deleted; serials compare case-insensitively.
        """
        CREATE TABLE evidence (
            id INTEGER PRIMARY KEY,
            serial TEXT NOT NULL COLLATE NOCASE,
            ek_sha256 TEXT NOT NULL,
            kind TEXT NOT NULL,
            ref TEXT,
            recorded_at REAL NOT NULL,
            recorded_by TEXT NOT NULL,
            withdrawn_at REAL,
            withdrawn_by TEXT,
            withdrawn_reason TEXT
        ) STRICT;
        CREATE INDEX evidence_by_serial ON evidence (serial, id);
        CREATE INDEX evidence_by_ek ON evidence (ek_sha256, id);
        CREATE TABLE ek_bindings (
            serial TEXT PRIMARY KEY COLLATE NOCASE,
            ek_sha256 TEXT NOT NULL UNIQUE,
            device TEXT NOT NULL,
            evidence INTEGER NOT NULL REFERENCES evidence (id),
            approved_at REAL NOT NULL,
            approved_by TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        6,
        # Disk reports (fleetd.trust.disks) [D1]: each device's latest
        # report, and one row per disk serial for the fleet-wide check.
        """
        CREATE TABLE disk_reports (
            device TEXT PRIMARY KEY,
            serial TEXT NOT NULL,
            reported_at REAL NOT NULL,
            verdict TEXT NOT NULL,
            target TEXT,
            disks TEXT NOT NULL
        ) STRICT;
        CREATE TABLE disk_serials (
            serial TEXT NOT NULL COLLATE NOCASE,
            device TEXT NOT NULL
                REFERENCES disk_reports (device) ON DELETE CASCADE,
            name TEXT NOT NULL,
            PRIMARY KEY (device, name)
        ) STRICT;
        CREATE INDEX disk_serials_by_serial ON disk_serials (serial, device);
        """,
    ),
    (
        7,
        # LDevID records [T4] (fleetd.pki.records): every certificate fleetd
        # issued, each node's current one, and legacy cut-overs.
        """
        CREATE TABLE ldevids (
            cert_serial TEXT PRIMARY KEY,
            chassis TEXT NOT NULL COLLATE NOCASE,
            device TEXT NOT NULL,
            issuer TEXT NOT NULL,
            not_after REAL NOT NULL,
            issued_at REAL NOT NULL,
            how TEXT NOT NULL CHECK (how IN ('attest', 'renew')),
            ek_sha256 TEXT,
            current INTEGER NOT NULL CHECK (current IN (0, 1))
        ) STRICT;
        CREATE UNIQUE INDEX ldevids_current ON ldevids (chassis) WHERE current = 1;
        CREATE TABLE ldevid_cutovers (
            chassis TEXT PRIMARY KEY COLLATE NOCASE,
            at REAL NOT NULL,
            from_issuer TEXT NOT NULL,
            from_serial TEXT NOT NULL
        ) STRICT;
        """,
    ),
    # Kubernetes credentials (fleetd.kube.store): tokens, kubelet
    # certificates, the cluster-wide token and its requests.
    (
        9,
        """
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
""",
    ),
    (
        10,
        """
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
""",
    ),
    (
        11,
        # The NetBox inventory (fleetd.netbox): the durable outbox of status
        # changes and releases, written in the transaction of the change
        # it carries [J1]; the journal mirror's progress; what NetBox has
        # no field for (desired actions); the last device list NetBox gave
        # (so a start while NetBox is down still knows the fleet).
        """
        CREATE TABLE netbox_outbox (
            id INTEGER PRIMARY KEY,
            device TEXT NOT NULL,
            status TEXT NOT NULL,
            run TEXT UNIQUE,
            served_at REAL,
            peer TEXT,
            digest TEXT,
            created_at REAL NOT NULL,
            state TEXT NOT NULL DEFAULT 'pending',
            attempts INTEGER NOT NULL DEFAULT 0,
            outcome TEXT
        ) STRICT;
        CREATE INDEX netbox_outbox_by_state ON netbox_outbox (state, id);
        CREATE INDEX netbox_outbox_by_device ON netbox_outbox (device, id);
        CREATE TABLE netbox_mirror (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            seq INTEGER NOT NULL,
            doubt INTEGER
        ) STRICT;
        CREATE TABLE netbox_local (
            device TEXT PRIMARY KEY,
            desired_action TEXT
        ) STRICT;
        CREATE TABLE netbox_devices (
            name TEXT PRIMARY KEY,
            device TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        12,
        # Disk claims [D1] (fleetd.trust.disks): the order in which devices
        # first reported each serial they still report; the first keeps it.
        # Reports stored before are ordered by their report time, and their
        # refusal lines stop naming the other device (the journal does).
        """
        ALTER TABLE disk_serials ADD COLUMN claim INTEGER NOT NULL DEFAULT 0;
        UPDATE disk_serials SET claim = (
            SELECT r.n FROM (
                SELECT device, ROW_NUMBER() OVER (ORDER BY reported_at, device) AS n
                FROM disk_reports
            ) AS r WHERE r.device = disk_serials.device
        );
        UPDATE disk_reports SET verdict = 'duplicate-disk-serial: a serial of this'
            || ' report is also reported by another device; refused until the'
            || ' owner decides (fleetctl disks forget)'
        WHERE verdict LIKE 'duplicate-disk-serial:%also reported by%';
        """,
    ),
    (
        13,
        # Tinkerbell's objects (fleetd.tinkerbell.store, issue 28): per run
        # its Workflow, per device its Hardware; each row's state is the
        # intent recorded before the API call ([J1], [K2]) and then what
        # the API did, so a restart resumes and never creates twice.
        """
        CREATE TABLE tinkerbell_workflows (
            namespace TEXT NOT NULL,
            name TEXT NOT NULL,
            device TEXT NOT NULL,
            run TEXT NOT NULL UNIQUE,
            state TEXT NOT NULL,
            current INTEGER NOT NULL,
            body TEXT NOT NULL,
            uid TEXT,
            digest TEXT,
            seen TEXT,
            problem TEXT,
            created_at REAL NOT NULL,
            changed_at REAL NOT NULL,
            PRIMARY KEY (namespace, name)
        ) STRICT;
        CREATE INDEX tinkerbell_workflows_by_device
            ON tinkerbell_workflows (device, created_at);
        CREATE TABLE tinkerbell_hardware (
            device TEXT PRIMARY KEY,
            namespace TEXT NOT NULL,
            state TEXT NOT NULL,
            macs TEXT NOT NULL,
            address TEXT,
            problem TEXT,
            changed_at REAL NOT NULL
        ) STRICT;
        """,
    ),
    (
        14,
        # The inventory's optional device address (fleetd.inventory, issue
        # 30): the node's own IPv4 or IPv6 address, unique while a device
        # holds it (NULLs are distinct in a UNIQUE index); forgetting a
        # retired device's identity frees it.
        """
        ALTER TABLE devices ADD COLUMN address TEXT;
        CREATE UNIQUE INDEX devices_by_address ON devices (address);
        """,
    ),
    (
        15,
        # Disk keys (fleetd.kms, issue 30): one row per key-encryption
        # key, wrapped by the KMS master key; a destroyed key keeps its row
        # (the record) and loses its material (wrapped becomes NULL).
        """
        CREATE TABLE kms_keys (
            id TEXT PRIMARY KEY,
            device TEXT NOT NULL,
            uuid TEXT NOT NULL,
            generation TEXT NOT NULL,
            wrapped BLOB,
            created_at REAL NOT NULL,
            destroyed_at REAL,
            destroyed_why TEXT,
            CHECK ((wrapped IS NULL) = (destroyed_at IS NOT NULL))
        ) STRICT;
        CREATE INDEX kms_keys_by_device ON kms_keys (device, created_at);
        CREATE INDEX kms_keys_live ON kms_keys (device) WHERE wrapped IS NOT NULL;
        """,
    ),
    # New migrations go here as (N, "..."), with a number reserved for
    # the subsystem, in ascending order: never edit or renumber one that
    # has shipped.
)
"""Schema migrations in order; C{PRAGMA user_version} records the last one."""
