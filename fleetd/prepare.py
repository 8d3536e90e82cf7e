"""
Read and check every file fleetd needs before anything listens, so a bad
configuration stops start-up with one line and nothing half-started.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetd.config import ConfigError, Settings
from fleetd.listen import loadTLSOptions
from fleetd.pki.dev import ensureDevPKI
from fleetd.store.db import Database
from fleetd.store.keys import loadOrCreateKey
from fleetd.vault import DirectoryVault, IClosableVault, VaultError


@dataclass(frozen=True)
class Prepared:
    """Everything read from disk before the listeners bind."""

    settings: Settings
    vault: IClosableVault
    database: Database
    masterKey: bytes


def prepare(settings: Settings) -> Prepared:
    """
    Read and check the files fleetd needs; raise L{ConfigError} on the first
    problem.

    With C{[dev] generate_pki}, the dev PKI is created first when missing.
    """
    if settings.dev_pki:
        ensureDevPKI(settings.tls.cert.parent, settings.topology.enrollment_name)
    if not settings.provision.templates.is_dir():
        raise ConfigError(
            "provision.templates",
            f"{settings.provision.templates} is not a directory of cluster templates",
        )
    # Parse the TLS material now so its errors name their keys.
    loadTLSOptions(settings.tls)
    loadTLSOptions(settings.tls, clientCA=settings.owner.client_ca)
    try:
        vault = DirectoryVault.open(settings.vault, settings.vault_allow_any_fs)
    except VaultError as e:
        raise ConfigError("paths.vault", str(e)) from e
    try:
        settings.state.mkdir(mode=0o700, parents=True, exist_ok=True)
        database = Database.open(settings.state / "fleetd.sqlite3")
        masterKey = loadOrCreateKey(settings.state / "master.key")
    except (OSError, Exception) as e:
        vault.close()
        if isinstance(e, ConfigError):
            raise
        raise ConfigError("paths.state", str(e)) from e
    return Prepared(settings, vault, database, masterKey)
