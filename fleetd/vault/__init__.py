"""The volatile vault for rendered configurations [V1] [V2]."""

from fleetd.vault.store import (
    DirectoryVault,
    IVault,
    MemoryVault,
    VaultError,
    checkName,
    filesystemType,
    parseMountInfo,
)

__all__ = [
    "DirectoryVault",
    "IVault",
    "MemoryVault",
    "VaultError",
    "checkName",
    "filesystemType",
    "parseMountInfo",
]
