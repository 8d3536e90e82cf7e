"""
Read and check every file fleetd needs before anything listens, so a bad
configuration stops start-up with one line and nothing half-started.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from OpenSSL import crypto

from fleetd.attest.ekroots import EKRoots
from fleetd.certexpiry import Watched, readCertificates
from fleetd.config import ConfigError, Settings
from fleetd.config.load import kmsListen
from fleetd.config.provision import kmsPort
from fleetd.kms.record import LoadedRecord, RecordError, loadRecord
from fleetd.kms.store import devicesWithLiveKeys
from fleetd.listen.tls import loadCertificates, loadTLSOptions
from fleetd.pki.dev import ensureDevPKI
from fleetd.pki.ldevid import Issuer, TrustBundle
from fleetd.runs.diskencryption import DiskEncryption
from fleetd.runs.placeholders import DevValues
from fleetd.runs.render import RenderError, TemplateRenderer
from fleetd.store.db import Database, StoreError
from fleetd.store.keys import loadOrCreateKey
from fleetd.vault import DirectoryVault, IClosableVault, VaultError


@dataclass(frozen=True)
class Prepared:
    """Everything read from disk before the listeners bind."""

    settings: Settings
    vault: IClosableVault
    database: Database
    masterKey: bytes
    issuer: Issuer
    ekRoots: EKRoots
    trustBundle: TrustBundle
    upstreamCA: bytes | None  # tink.upstream_ca's PEM, when set
    # The vault as opened, its entries listed but not yet looked at: the
    # daemon's load checks them (in a thread, beside its database reads).
    uncheckedVault: DirectoryVault | None = None
    # Certificates read once, for fleetd_certificate_not_after_seconds (the
    # listeners' own are read from them at each scrape).
    certificates: tuple[Watched, ...] = ()
    # [kms]'s master key (kms.master_key), which wraps every disk key.
    kmsKey: bytes | None = None
    # [kms]'s destruction record (kms.destroyed_keys), as read at start.
    kmsRecord: LoadedRecord | None = None


def prepare(settings: Settings) -> Prepared:
    """
    Read and check the files fleetd needs; raise L{ConfigError} on the first
    problem.

    With C{[dev] generate_pki}, the dev PKI is created first when missing.
    Every cluster's template is read and checked: one holding an unfilled
    placeholder is refused, unless C{[dev] generate_values} fills them.
    """
    if settings.dev_pki:
        ensureDevPKI(settings.tls.cert.parent, settings.topology.enrollment_name)
    if not settings.provision.templates.is_dir():
        raise ConfigError(
            "provision.templates",
            f"{settings.provision.templates} is not a directory of cluster templates",
        )
    checkTemplates(settings)
    # Parse the TLS material now so its errors name their keys.
    loadTLSOptions(settings.tls)
    loadTLSOptions(settings.tls, clientCA=settings.owner.client_ca)
    checkOwnerCA(settings)
    if settings.netbox is not None:
        from fleetd.netbox.connect import NetBoxSetupError, readToken, tlsPolicy

        try:
            readToken(settings.netbox.token_file)
            tlsPolicy(settings.netbox.ca)
        except NetBoxSetupError as e:
            raise ConfigError(e.key, e.problem) from None
    upstreamCA = checkUpstreamCA(settings)
    pki = settings.pki
    issuer = Issuer.load(
        pki.issuer_cert, pki.issuer_key, timedelta(days=pki.ldevid_days)
    )
    ekRoots = EKRoots.load(settings.ek_roots)
    trustBundle = TrustBundle.load(pki.bundle, issuer.cert)
    try:
        vault = DirectoryVault.open(
            settings.vault, settings.vault_allow_any_fs, check=False
        )
    except VaultError as e:
        raise ConfigError("paths.vault", str(e)) from e
    database: Database | None = None
    try:
        settings.state.mkdir(mode=0o700, parents=True, exist_ok=True)
        database = Database.open(settings.state / "fleetd.sqlite3")
        masterKey = loadOrCreateKey(settings.state / "master.key")
        kmsKey = kmsMasterKey(settings, database)
        kmsRecord = kmsDestroyedKeys(settings)
    except (OSError, Exception) as e:
        vault.close()
        if database is not None:
            database.close()
        if isinstance(e, ConfigError):
            raise
        raise ConfigError("paths.state", str(e)) from e
    return Prepared(
        settings,
        vault,
        database,
        masterKey,
        issuer=issuer,
        ekRoots=ekRoots,
        trustBundle=trustBundle,
        upstreamCA=upstreamCA,
        uncheckedVault=vault,
        certificates=readAtStart(settings, issuer),
        kmsKey=kmsKey,
        kmsRecord=kmsRecord,
    )


def diskEncryptionOf(settings: Settings) -> DiskEncryption | None:
    """
    The classes whose configurations carry fleetd's KMS key and where
    nodes reach it (the enrollment name, C{listen.kms}'s port); L{None}
    when no class opts in (issue 30).
    """
    port = kmsPort(settings.provision, kmsListen(settings))
    if port is None:
        return None
    classes = settings.provision.diskEncryptionClasses()
    return DiskEncryption(classes, settings.topology.enrollment_name, port)


def checkTemplates(settings: Settings) -> None:
    """
    Every cluster's template can be rendered; without C{[dev]
    generate_values}, none holds an unfilled placeholder (issue 27); when
    a class opts in to disk encryption, each has the place for it (issue
    30), whatever the dev values.

    @raise ConfigError: naming C{provision.templates}, the file, the line
        and the reason.
    """
    encryption = diskEncryptionOf(settings)
    if settings.dev_values and encryption is None:
        return  # filled from generated values when rendered
    # Dev values stand in for placeholders only; they render nothing here.
    values = DevValues(bytes(32)) if settings.dev_values else None
    renderer = TemplateRenderer(
        settings.provision.templates, values=values, diskEncryption=encryption
    )
    try:
        renderer.checkAll()
    except RenderError as e:
        raise ConfigError("provision.templates", str(e)) from None


def readAtStart(settings: Settings, issuer: Issuer) -> tuple[Watched, ...]:
    """
    The certificates fleetd reads once and uses until it restarts, as it
    uses them: the LDevID issuer it signs with, the client certificate it
    presents to the Kubernetes API, and the CAs it verifies its peers with
    (the Kubernetes API, NetBox, tink-server). The TPM manufacturers' roots
    are left out: not the site's to renew, and an expired one refuses
    attestation with that reason (docs/operations.md, FleetCertificateExpiring).
    """
    watched = [Watched("pki.issuer_cert", "", (issuer.cert,))]
    files: list[tuple[str, Path | None, bool]] = []
    kube = settings.kubernetes
    if kube is not None:
        client = kube.client_cert if kube.token_file is None else None
        # Certificate.loadPEM, as fleetd's client reads them: the first only.
        files += [
            ("kubernetes.ca", kube.ca, True),
            ("kubernetes.client_cert", client, True),
        ]
    if settings.netbox is not None:
        files.append(("netbox.ca", settings.netbox.ca, False))
    files.append(("tink.upstream_ca", settings.tink.upstream_ca, True))
    for key, path, first in files:
        if path is not None:
            watched.append(Watched(key, "", readCertificates(path, first=first)))
    return tuple(watched)


def checkUpstreamCA(settings: Settings) -> bytes | None:
    """C{tink.upstream_ca}, when set, is readable PEM certificates: their PEM."""
    path = settings.tink.upstream_ca
    if path is None:
        return None
    try:
        pem = path.read_bytes()
        crypto.load_certificate(crypto.FILETYPE_PEM, pem)
    except (OSError, crypto.Error) as e:
        raise ConfigError("tink.upstream_ca", f"cannot use {path}: {e}") from e
    return pem


def _publicKey(cert: crypto.X509) -> bytes:
    der: bytes = (
        cert.to_cryptography()
        .public_key()
        .public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    )
    return der


def _issuedBy(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether C{issuer}'s key signed C{cert} (names match, signature verifies)."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def checkOwnerCA(settings: Settings) -> None:
    """
    [O1] The owner CA is one certificate and trusted for nothing else.

    C{owner.client_ca} must hold exactly one certificate, and that CA (its
    key) must not also be in the LDevID trust bundle, be the LDevID issuer
    or appear in the public certificate's chain; nor may any certificate
    there be issued by it (so nothing there chains to it): a CA under the
    owner CA that issues device or server certificates would make their
    holders owners once they send it along. Checked by signature, not by
    name.

    @raise ConfigError: naming C{owner.client_ca} and the other key.
    """
    cas = loadCertificates("owner.client_ca", settings.owner.client_ca)
    if len(cas) != 1:
        raise ConfigError(
            "owner.client_ca",
            f"{settings.owner.client_ca} holds {len(cas)} certificates; it must "
            "hold exactly the one owner CA",
        )
    owner = _publicKey(cas[0])
    others: list[tuple[str, str, Path | None]] = [
        ("pki.bundle", "in the LDevID trust bundle", settings.pki.bundle),
        ("pki.issuer_cert", "the LDevID issuer", settings.pki.issuer_cert),
        ("tls.cert", "in the public certificate chain", settings.tls.cert),
        ("tls.chain", "in the public certificate chain", settings.tls.chain),
    ]
    ownerCA = cas[0].to_cryptography()
    for key, what, path in others:
        if path is None:
            continue
        for cert in loadCertificates(key, path):
            if _publicKey(cert) == owner:
                raise ConfigError(
                    "owner.client_ca",
                    f"the owner CA is also {what} ({key}); owners need a CA "
                    "that issues nothing else",
                )
            if _issuedBy(cert.to_cryptography(), ownerCA):
                raise ConfigError(
                    "owner.client_ca",
                    f"a certificate {what} ({key}), "
                    f"{cert.to_cryptography().subject.rfc4514_string()[:80]!r}, "
                    "was issued by the owner CA; owners need a CA that issues "
                    "nothing else",
                )


def kmsMasterKey(settings: Settings, database: Database) -> bytes | None:
    """With C{[kms]}, its master key: read, or made on the first start
    (32 random bytes, mode 0600; docs/decisions.md, issue 30). Missing while
    the database holds live keys it wrapped, it is not made again: a new one
    would open none of them, and every node's disk would stay shut."""
    if settings.kms is None:
        return None
    path = settings.kms.masterKeyPath(settings.state)
    if not path.exists() and devicesWithLiveKeys(database):
        raise ConfigError(
            "kms.master_key",
            f"{path} is missing, and the state database holds live disk keys"
            " it wrapped: put the master key file back (docs/operations.md,"
            ' "Disk keys"); a new one would open none of them',
        )
    try:
        return loadOrCreateKey(path)
    except StoreError as e:
        raise ConfigError("kms.master_key", str(e)) from e


def kmsDestroyedKeys(settings: Settings) -> LoadedRecord | None:
    """With C{[kms]}, its destruction record: read (made when missing); a
    malformed one stops start-up (docs/decisions.md, issue 30)."""
    if settings.kms is None:
        return None
    try:
        return loadRecord(settings.kms.destroyedKeysPath(settings.state))
    except RecordError as e:
        raise ConfigError("kms.destroyed_keys", str(e)) from e
