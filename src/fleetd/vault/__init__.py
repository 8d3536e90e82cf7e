"""The volatile vault for rendered configurations [V1] [V2]."""

from fleetd.vault.errors import VaultError, VaultWriteError
from fleetd.vault.interface import IClosableVault, IVault, MemoryVault, checkName
from fleetd.vault.mounts import filesystemType, parseMountInfo
from fleetd.vault.store import DirectoryVault

__all__ = [
    "DirectoryVault",
    "IClosableVault",
    "IVault",
    "MemoryVault",
    "VaultError",
    "VaultWriteError",
    "checkName",
    "filesystemType",
    "parseMountInfo",
]
