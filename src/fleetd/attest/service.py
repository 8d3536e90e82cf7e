"""
Attestation and LDevID issuance over the device listener [T2] [T3] [T4].

Two steps. C{begin}: the node sends its TPM version, EK certificate and
public area, AK public area and the serial it reports; fleetd checks the
chain, the EK, its approved binding, the device's class and the AK, and
answers with a MakeCredential challenge and a nonce. C{prove}: the node
sends the activated secret, its LDevID public area, a TPM2_Certify of it by
the AK over the nonce, and a CSR; fleetd checks them and issues an LDevID
whose subject comes from the inventory. Renewal (C{renew}) takes a CSR for
the same key over mTLS with the current LDevID.

Every refusal is journaled with its reason code (L{RefusalRecorder}),
naming the device the node's claim maps to where no binding names one
(L{fleetd.attest.naming}); an issuance and its record commit in one
transaction with their journal entries [J1], and the in-memory book
follows only after that commit. HTTP lives in L{fleetd.device.attest}.
"""

from __future__ import annotations

import hmac
import os
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from prometheus_client import CollectorRegistry
from tpm2_pytss.types import TPM2B_PUBLIC
from twisted.internet.interfaces import IReactorTime

from fleetd import nodes as E
from fleetd.attest.bindings import (
    ApprovedSerialFor,
    BindingRefusal,
    lineRefusal,
    noBindingReason,
)
from fleetd.attest.challenge import ChallengeBook, NoRoom, Presented
from fleetd.attest.ekroots import EKRoots
from fleetd.attest.fields import (
    b64Field,
    b64Text,
    csrField,
    noRoomRefusal,
    pemText,
    textField,
)
from fleetd.attest.identity import LDevIDBook, Peer
from fleetd.attest.inventory import busyWhileUnavailable, refuseRetired
from fleetd.attest.naming import Claim, KnownDevices, SerialsForEK, noSerials
from fleetd.attest.recorder import ACTOR, RefusalRecorder
from fleetd.attest.results import AttestResults
from fleetd.attest.tpm import (
    checkAK,
    checkEK,
    checkLDevID,
    ekDigest,
    makeChallenge,
    parsePublic,
    spkiOf,
    verifyCertify,
)
from fleetd.config import Settings
from fleetd.inventory.model import REFUSED_CLASSES, Device
from fleetd.nodes import Refused
from fleetd.pki.ldevid import Issuer, Subject, serialHex, spkiDER
from fleetd.pki.records import LDevIDRecord, storeIssued
from fleetd.store.db import Database
from fleetd.store.journal import AsyncJournal, Recorder
from fleetd.store.runner import IRunner

DeviceBySerial = Callable[[str], Awaitable[Device | None]]
# A reported serial is the caller's text: journaled, but never at any length.
REPORTED_SERIAL_MAX = 64


@dataclass(frozen=True)
class _Context:
    device: str
    serial: str
    ekSha256: str
    ak: TPM2B_PUBLIC
    secret: bytes
    nonce: bytes


class AttestationService:
    def __init__(
        self,
        *,
        clock: IReactorTime,
        runner: IRunner,
        journal: AsyncJournal,
        ekRoots: EKRoots,
        issuer: Issuer,
        book: LDevIDBook,
        approvedSerialFor: ApprovedSerialFor,
        deviceBySerial: DeviceBySerial,
        challengeTTL: float = Settings.challenge_ttl,
        bindingRefusal: BindingRefusal = noBindingReason,
        metrics: CollectorRegistry | None = None,
        known: KnownDevices | None = None,
        serialsForEK: SerialsForEK = noSerials,
    ) -> None:
        """
        @param known: the devices a refusal's claim may name (issue 27).
        @param serialsForEK: the serials an EK's evidence names, for that.
        """
        self.clock = clock
        self.runner = runner
        self.journal = journal
        self.ekRoots = ekRoots
        self.issuer = issuer
        self.book = book
        self._approvedSerialFor = approvedSerialFor
        self._deviceBySerial = busyWhileUnavailable(deviceBySerial, bySerial=True)
        self._bindingRefusal = bindingRefusal
        self._serialsForEK = serialsForEK
        self.challenges = ChallengeBook(clock, challengeTTL)
        self.results = AttestResults(metrics)
        self.refusals = RefusalRecorder(clock, journal, self.results, known)

    def stop(self) -> None:
        self.challenges.stop()

    async def refuse(
        self, refusal: Refused, *, device: str | None = None, **fields: str | None
    ) -> Refused:
        """Record C{refusal} about C{device} (L{RefusalRecorder}); return it."""
        return await self.refusals.refuse(refusal, device=device, fields=fields)

    # Step 1

    async def begin(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Check the claim and answer with a challenge. @raise Refused."""
        context: dict[str, str | None] = {}
        claim = Claim()
        try:
            return await self._begin(doc, context, claim)
        except Refused as refusal:
            device = context.pop("device", None)
            raise await self.refusals.refuse(
                refusal, device=device, claim=claim, fields=context
            ) from None

    async def _begin(
        self, doc: Mapping[str, Any], context: dict[str, str | None], claim: Claim
    ) -> dict[str, Any]:
        version = textField(doc, "tpm_version", 16)
        reported = doc.get("serial")
        context["reported_serial"] = (
            reported[:REPORTED_SERIAL_MAX] if isinstance(reported, str) else None
        )
        claim.reported(reported, doc.get("uuid"))
        if version != "2.0":
            # [T2] by the version the node reports, not by certificate presence
            if version.startswith("1."):
                raise Refused(
                    E.TPM12, f"TPM {version} cannot attest; TPM 2.0 is required"
                )
            raise Refused(E.MALFORMED, "tpm_version: must be 2.0")
        reportedSerial = textField(doc, "serial")
        ekCert = self.ekRoots.verify(b64Field(doc, "ek_cert"))
        ek = parsePublic(b64Field(doc, "ek_public"), "ek_public")
        digest = ekDigest(checkEK(ek, ekCert.spki))
        context["ek_sha256"] = digest
        serial = await self.runner.run(
            lambda db: self._approvedSerialFor(db.connection, digest)
        )
        if serial is None:
            raise await self._unbound(digest, claim)
        context["serial"] = serial
        claim.ekSerials = [serial]  # a refusal below concerns the bound machine
        if serial.lower() != reportedSerial.lower():
            raise Refused(
                E.SERIAL_MISMATCH,
                "this EK is bound to another chassis than the one reported",
            )
        device = await self._deviceBySerial(serial)
        if device is None:
            raise Refused(E.UNKNOWN_DEVICE, "no inventory device has the bound serial")
        context["device"] = device.name
        if device.device_class in REFUSED_CLASSES:
            raise Refused(E.CLASS_REFUSED, f"class {device.device_class} cannot attest")
        refuseRetired(device)  # [R1]
        ak = parsePublic(b64Field(doc, "ak_public"), "ak_public")
        checkAK(ak)
        # [T1] A new begin never cancels a pending challenge (the claim is
        # public): a few per EK, then refused until one is answered or expires.
        try:
            self.challenges.room(digest)
            secret, nonce = os.urandom(32), os.urandom(32)
            blob, encrypted = makeChallenge(ek, ak, secret)
            ident = self.challenges.issue(
                _Context(device.name, device.serial, digest, ak, secret, nonce),
                key=digest,
            )
        except NoRoom as full:
            raise noRoomRefusal(full) from None
        return {
            "challenge": ident,
            "credential_blob": b64Text(blob),
            "encrypted_secret": b64Text(encrypted),
            "nonce": b64Text(nonce),
            "ttl": self.challenges.ttl,
        }

    # Step 2

    async def prove(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Check the proof and issue the LDevID. @raise Refused."""
        context: dict[str, str | None] = {}
        try:
            return await self._prove(doc, context)
        except Refused as refusal:
            device = context.pop("device", None)
            raise await self.refuse(refusal, device=device, **context) from None

    async def _prove(
        self, doc: Mapping[str, Any], context: dict[str, str | None]
    ) -> dict[str, Any]:
        ident = textField(doc, "challenge", 64)
        presented = self.challenges.present(ident)
        if presented is None:
            raise Refused(E.CHALLENGE_UNKNOWN, "no such challenge")
        outcome, ctx = presented
        assert isinstance(ctx, _Context)
        context.update(device=ctx.device, serial=ctx.serial, ek_sha256=ctx.ekSha256)
        if outcome is Presented.USED:
            raise Refused(E.CHALLENGE_USED, "this challenge was already answered")
        if outcome is Presented.EXPIRED:
            raise Refused(E.CHALLENGE_EXPIRED, "this challenge expired; start again")
        if not hmac.compare_digest(b64Field(doc, "secret", 128), ctx.secret):
            raise Refused(E.ACTIVATION_FAILED, "the activated credential is wrong")
        ldevid = parsePublic(b64Field(doc, "ldevid_public"), "ldevid_public")
        checkLDevID(ldevid)
        verifyCertify(
            b64Field(doc, "certify_info"),
            b64Field(doc, "certify_signature"),
            ctx.ak,
            ctx.nonce,
            ldevid,
        )
        _, key = csrField(doc)
        if not hmac.compare_digest(spkiDER(key), spkiOf(ldevid)):
            raise Refused(E.CSR_INVALID, "csr key is not the certified LDevID key")
        # The device as it is now: retired since the challenge, no LDevID [R1].
        device = await self._deviceBySerial(ctx.serial)
        if device is None or device.name != ctx.device:
            raise Refused(E.UNKNOWN_DEVICE, "no inventory device has the bound serial")
        refuseRetired(device)
        # The subject comes from the inventory, never from the CSR.
        cert = self.issuer.issue(
            key, Subject(ctx.device, ctx.serial), self.clock.seconds()
        )
        # The binding is checked again in the issuing transaction [T1] [T3].
        await self._record(cert, ctx.device, ctx.serial, "attest", ctx.ekSha256)
        self.results.accepted()  # issued and committed with its record [J1]
        return {"certificate": pemText(cert), "chain": pemText(self.issuer.cert)}

    # Renewal [T4]

    async def renew(self, peer: Peer, doc: Mapping[str, Any]) -> dict[str, Any]:
        """
        A new LDevID from the one issuer for the key the node holds now.

        Only an LDevID that attestation issued (or renewed from one) is
        renewed: its record carries the EK digest, whose binding must still
        hold for this serial when the new one commits, and the device must
        not be retired [T1] [T3] [R1]. A legacy (capsule/forge) LDevID holds
        a software key with no TPM proof: such a node cuts over by
        attesting (C{attest-required}), never by renewal [T4].
        """
        ident = peer.identity
        try:
            _, key = csrField(doc)
            if not hmac.compare_digest(spkiDER(key), spkiDER(peer.cert.public_key())):
                raise Refused(E.CSR_INVALID, "renewal keeps the key: csr key differs")
            current = self.book.current(ident.serial)
            if peer.legacy or current is None or current.ek_sha256 is None:
                raise Refused(
                    E.ATTEST_REQUIRED,
                    "this LDevID was not issued on a TPM attestation; attest"
                    " (fleetd-agent attest) to get one from the current issuer",
                )
            # The subject comes from the inventory, as at attestation.
            device = await self._deviceBySerial(ident.serial)
            if device is None:
                raise Refused(E.UNKNOWN_DEVICE, "no inventory device has this serial")
            refuseRetired(device)
            cert = self.issuer.issue(
                key, Subject(device.name, device.serial), self.clock.seconds()
            )
            # The EK link is carried forward and checked again [T1].
            await self._record(
                cert, device.name, device.serial, "renew", current.ek_sha256
            )
        except Refused as refusal:
            raise await self.refuse(
                refusal, device=ident.device, serial=ident.serial
            ) from None
        self.results.renewed()
        return {"certificate": pemText(cert), "chain": pemText(self.issuer.cert)}

    async def _unbound(self, ekSha256: str, claim: Claim) -> Refused:
        """
        [T1] The refusal for an EK without a usable binding, saying why;
        C{claim} learns the serials the EK's evidence names (one read).
        """

        def read(db: Database) -> str:
            claim.ekSerials = self._serialsForEK(db.connection, ekSha256)
            return self._bindingRefusal(db.connection, ekSha256)

        return lineRefusal(await self.runner.run(read))

    def bindingHolds(self, db: sqlite3.Connection, ekSha256: str, serial: str) -> None:
        """
        [T1] The approved binding of C{ekSha256} still names C{serial};
        usable inside the caller's transaction.

        @raise Refused: C{ek-binding-not-approved} with the reason, or
            C{serial-mismatch} when the EK is now bound to another chassis.
        """
        bound = self._approvedSerialFor(db, ekSha256)
        if bound is None:
            raise lineRefusal(self._bindingRefusal(db, ekSha256))
        if bound.lower() != serial.lower():
            raise Refused(
                E.SERIAL_MISMATCH,
                "this node's EK is now bound to another chassis than its LDevID names",
            )

    async def _record(
        self,
        cert: x509.Certificate,
        device: str,
        serial: str,
        how: str,
        ekSha256: str,
    ) -> None:
        now = self.clock.seconds()
        record = LDevIDRecord(
            cert_serial=serialHex(cert),
            chassis=serial,
            device=device,
            issuer=self.issuer.name,
            not_after=cert.not_valid_after_utc.timestamp(),
            issued_at=now,
            how=how,
            ek_sha256=ekSha256,
        )

        def change(db: Database, record_: Recorder) -> None:
            self.bindingHolds(db.connection, ekSha256, serial)
            replaced = storeIssued(db, record)
            record_(
                "ldevid.issued",
                actor=ACTOR,
                device=device,
                fields={
                    "serial": serial,
                    "cert_serial": record.cert_serial,
                    "issuer": record.issuer,
                    "not_after": record.not_after,
                    "how": how,
                    "ek_sha256": ekSha256,
                    "replaces": None if replaced is None else replaced.cert_serial,
                },
            )

        await self.journal.change(change)
        self.book.issued(record)
