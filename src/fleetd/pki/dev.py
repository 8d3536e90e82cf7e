"""
The development PKI: every CA, certificate and key the dev config names.

Generated with C{cryptography} on the first dev run (and in tests), never
committed. One directory holds a stand-in public CA and the listeners' leaf,
the LDevID issuer plus the legacy capsule and forge software CAs and their
concatenated trust bundle [T4], an owner CA with one fleetctl client
certificate, and a stand-in TPM manufacturer CA (RSA, in C{ek-roots/})
that can certify swtpm EKs for simulated nodes (L{swtpmLocalCA} writes
the swtpm_setup configuration for it). Generation is all-or-nothing: a
complete set is left alone (a running daemon keeps its certificates),
anything less is regenerated whole.

C{fleetd-devpki --config FILE} runs it from the command line
(L{fleetd.pki.devcli}).
"""

from __future__ import annotations

import ipaddress
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from secrets import token_hex
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleetd.pki.owners import OWNER, rolePolicies

__all__ = ["DevPKIPaths", "ensureDevPKI", "makeCertificate", "swtpmLocalCA"]

CA_VALIDITY = timedelta(days=3650)
LEAF_VALIDITY = timedelta(days=365)
BACKDATE = timedelta(hours=1)

KEY_MODE = 0o600
CERT_MODE = 0o644
DIR_MODE = 0o700

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class DevPKIPaths:
    """Every file the dev PKI writes, all inside one directory."""

    directory: Path
    public_ca: Path
    public_ca_key: Path
    public_cert: Path
    public_key: Path
    devid_issuer: Path
    devid_issuer_key: Path
    capsule_ca: Path
    capsule_ca_key: Path
    forge_ca: Path
    forge_ca_key: Path
    bundle: Path
    owner_ca: Path
    owner_ca_key: Path
    owner_cert: Path
    owner_key: Path
    ek_roots: Path
    ek_ca: Path
    ek_ca_key: Path

    @classmethod
    def inside(cls, directory: Path) -> DevPKIPaths:
        """The standard file names under C{directory}."""
        d = directory
        return cls(
            directory=d,
            public_ca=d / "public-ca.pem",
            public_ca_key=d / "public-ca.key",
            public_cert=d / "public.pem",
            public_key=d / "public.key",
            devid_issuer=d / "devid-issuer.pem",
            devid_issuer_key=d / "devid-issuer.key",
            capsule_ca=d / "capsule-ca.pem",
            capsule_ca_key=d / "capsule-ca.key",
            forge_ca=d / "forge-ca.pem",
            forge_ca_key=d / "forge-ca.key",
            bundle=d / "folly-devid-ca.pem",
            owner_ca=d / "owner-ca.pem",
            owner_ca_key=d / "owner-ca.key",
            owner_cert=d / "owner.pem",
            owner_key=d / "owner.key",
            ek_roots=d / "ek-roots",
            ek_ca=d / "ek-roots" / "dev-ek-ca.pem",
            ek_ca_key=d / "dev-ek-ca.key",
        )

    def files(self) -> tuple[Path, ...]:
        """Every regular file of the set (not the directories)."""
        skip = {"directory", "ek_roots"}
        return tuple(getattr(self, f.name) for f in fields(self) if f.name not in skip)

    def complete(self) -> bool:
        """Whether every file of the set exists."""
        return all(p.is_file() for p in self.files())


def devConfigTables(server: str, directory: str = "pki") -> dict[str, dict[str, Any]]:
    """
    The tables of a fleetd config that use a dev PKI under C{directory}
    (relative to the config file) and generate it on first run: C{dev}
    (which also fills templates' placeholders with dev values), C{tls},
    C{pki}, C{attest}, C{owner} (fleetctl's admin URL C{server}).
    """
    d = DevPKIPaths.inside(Path(directory))
    return {
        "dev": {"generate_pki": True, "generate_values": True},
        "tls": {"cert": str(d.public_cert), "key": str(d.public_key),
                "chain": str(d.public_ca)},
        "pki": {"issuer_cert": str(d.devid_issuer),
                "issuer_key": str(d.devid_issuer_key), "bundle": str(d.bundle)},
        "attest": {"ek_roots": str(d.ek_roots)},
        "owner": {"client_ca": str(d.owner_ca), "client_cert": str(d.owner_cert),
                  "client_key": str(d.owner_key), "server": server,
                  "server_ca": str(d.public_ca)},
    }  # fmt: skip


def ensureDevPKI(
    directory: Path,
    enrollmentName: str,
    *,
    now: datetime | None = None,
    keyType: str = "ecdsa",
) -> DevPKIPaths:
    """
    Make sure a complete dev PKI exists in C{directory}.

    A complete set is returned untouched; a partial one (a crash mid-way,
    a deleted file) is discarded and generated again as a whole, so the
    files always belong together.

    @param enrollmentName: the DNS name the public leaf covers, beside
        C{localhost}, 127.0.0.1 and ::1.
    @param now: the issuing time (UTC); certificates start one hour before.
    @param keyType: C{"ecdsa"} (P-256) or C{"rsa"} (2048 bits).
    @raise ValueError: on a bad name or key type.
    @raise OSError: when the files cannot be written.
    """
    paths = DevPKIPaths.inside(directory)
    if paths.complete():
        _makeDirectory(paths.ek_roots)
        return paths
    name = _checkName(enrollmentName)
    if keyType not in ("ecdsa", "rsa"):
        raise ValueError(f"keyType must be 'ecdsa' or 'rsa', not {keyType!r}")
    when = datetime.now(UTC) if now is None else now
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    contents = _generate(paths, name, when, keyType)
    _makeDirectory(directory)
    os.chmod(directory, DIR_MODE)
    _makeDirectory(paths.ek_roots)
    for stale in [*paths.files(), *directory.glob(".*.tmp")]:
        stale.unlink(missing_ok=True)
    for path, (data, mode) in contents.items():
        writeAtomic(path, data, mode)
    fd = os.open(directory, os.O_RDONLY)  # make the renames durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return paths


def _checkName(name: str) -> str:
    cleaned = name.strip().rstrip(".").lower()
    if not cleaned or not cleaned.isascii() or any(c.isspace() for c in cleaned):
        raise ValueError(f"not a usable DNS name: {name!r}")
    return cleaned


# The CAs of the set: the DevPKIPaths attribute of each certificate (its key
# is the same attribute + "_key") and its common name.
_CAS = (
    ("public_ca", "fleetd dev public CA"),
    ("devid_issuer", "folly devid issuer (dev)"),
    ("capsule_ca", "capsule software CA (dev)"),
    ("forge_ca", "forge software CA (dev)"),
    ("owner_ca", "fleetd dev owner CA"),
)


def _generate(
    paths: DevPKIPaths, name: str, now: datetime, keyType: str
) -> dict[Path, tuple[bytes, int]]:
    """Create every key and certificate in memory; nothing touches disk."""
    out: dict[Path, tuple[bytes, int]] = {}
    cas: dict[str, tuple[x509.Certificate, PrivateKey]] = {}
    for attribute, cn in _CAS:
        key = newKey(keyType)
        cert = makeCertificate(cn, key, now)
        cas[attribute] = (cert, key)
        out[getattr(paths, attribute)] = (certPEM(cert), CERT_MODE)
        out[getattr(paths, attribute + "_key")] = (keyPEM(key), KEY_MODE)
    # The stand-in TPM manufacturer: RSA, as swtpm_localca signs with it.
    ekKey = newKey("rsa")
    ekCA = makeCertificate("fleetd dev TPM manufacturer CA", ekKey, now)
    out[paths.ek_ca] = (certPEM(ekCA), CERT_MODE)
    out[paths.ek_ca_key] = (keyPEM(ekKey), KEY_MODE)
    bundle = [cas[a][0] for a in ("devid_issuer", "capsule_ca", "forge_ca")]
    out[paths.bundle] = (b"".join(map(certPEM, bundle)), CERT_MODE)

    sans: tuple[x509.GeneralName, ...] = (
        x509.DNSName(name),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    )
    # The owner's certificate states its role [O4], as fleetd-pki's do.
    leaves = (
        (paths.public_cert, paths.public_key, name, ExtendedKeyUsageOID.SERVER_AUTH,
         sans, cas["public_ca"], ()),
        (paths.owner_cert, paths.owner_key, "owner", ExtendedKeyUsageOID.CLIENT_AUTH,
         (), cas["owner_ca"], (rolePolicies(OWNER),)),
    )  # fmt: skip
    for certPath, keyPath, cn, eku, names, issuer, extensions in leaves:
        key = newKey(keyType)
        cert = makeCertificate(cn, key, now, issuer, eku, names, extensions=extensions)
        out[certPath] = (certPEM(cert), CERT_MODE)
        out[keyPath] = (keyPEM(key), KEY_MODE)
    return out


def swtpmLocalCA(paths: DevPKIPaths, directory: Path) -> Path:
    """
    Write an swtpm_setup configuration under C{directory} whose EK
    certificates are signed by the dev TPM manufacturer CA; return the
    C{swtpm_setup.conf} to pass as C{--config}.
    """
    import shutil

    directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    localca = directory / "swtpm-localca.conf"
    options = directory / "swtpm-localca.options"
    setup = directory / "swtpm_setup.conf"
    localca.write_text(
        f"statedir = {directory}\n"
        f"signingkey = {paths.ek_ca_key}\n"
        f"issuercert = {paths.ek_ca}\n"
        f"certserial = {directory / 'certserial'}\n"
    )
    options.write_text(
        "--platform-manufacturer fleetd\n--platform-version 1.0\n"
        "--platform-model fleetd-dev\n"
    )
    tool = shutil.which("swtpm_localca") or "/usr/bin/swtpm_localca"
    setup.write_text(
        f"create_certs_tool = {tool}\n"
        f"create_certs_tool_config = {localca}\n"
        f"create_certs_tool_options = {options}\n"
        "active_pcr_banks = sha256\n"
    )
    return setup


def newKey(keyType: str) -> PrivateKey:
    """A new C{"rsa"} (2048) or ECDSA (P-256) private key."""
    if keyType == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _keyUsage(*, signer: bool, rsaKey: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not signer,
        content_commitment=False,
        key_encipherment=rsaKey and not signer,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signer,
        crl_sign=signer,
        encipher_only=False,
        decipher_only=False,
    )


def makeCertificate(
    cn: str,
    key: PrivateKey,
    now: datetime,
    issuer: tuple[x509.Certificate, PrivateKey] | None = None,
    eku: x509.ObjectIdentifier | None = None,
    sans: Sequence[x509.GeneralName] = (),
    validity: timedelta | None = None,
    extensions: Sequence[x509.ExtensionType] = (),
) -> x509.Certificate:
    """
    A self-signed CA for leaves only (no C{issuer}), or a leaf it signs;
    valid from an hour before C{now} for C{validity} (default ten years for
    a CA, one for a leaf), with C{extensions} added (not critical).
    """
    public = key.public_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    if issuer is None:
        issuerName, signer, default = subject, key, CA_VALIDITY
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(public)
    else:
        (issuerCert, signer), default = issuer, LEAF_VALIDITY
        issuerName = issuerCert.subject
        ski = issuerCert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value)
    isCA, isRSA = issuer is None, isinstance(key, rsa.RSAPrivateKey)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuerName)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + (default if validity is None else validity))
        .add_extension(x509.BasicConstraints(isCA, 0 if isCA else None), critical=True)
        .add_extension(_keyUsage(signer=isCA, rsaKey=isRSA), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), False)
        .add_extension(aki, critical=False)
    )
    if eku is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([eku]), False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(signer, hashes.SHA256())


def certPEM(cert: x509.Certificate) -> bytes:
    """C{cert} as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


def keyPEM(key: PrivateKey) -> bytes:
    """C{key} as unencrypted PKCS#8 PEM (files of mode 0600)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _makeDirectory(path: Path) -> None:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def writeAtomic(path: Path, data: bytes, mode: int) -> None:
    """Write C{data} to a temporary file with C{mode}, fsync, rename over."""
    tmp = path.with_name(f".{path.name}.{token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have cleared bits of 0644
        actual = stat.S_IMODE(os.fstat(fd).st_mode)
        if actual != mode:
            raise PermissionError(f"{tmp} has mode {actual:o}, wanted {mode:o}")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
