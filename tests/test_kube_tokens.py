"""
[K1] Per-node bootstrap tokens issued with provisions, and [J1]: the
Secret is created before the commit and deleted when the commit fails.
"""

from __future__ import annotations

import sqlite3

from cryptography.exceptions import InvalidTag
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import DeviceStatus
from fleetd.k8s.client import KubeUnavailable
from fleetd.kube.tokens import (
    NODE_GROUP,
    TALOS_GROUP,
    TOKEN_TYPE,
    Sealer,
    mintToken,
    tokenSecret,
)
from fleetd.runs.render import NodeFacts
from tests.fleetsupport import DEV_VALUES, RENDERER
from tests.kubesupport import KubeFleet, device, secretData


class TokenFormatTests(SynchronousTestCase):
    def test_mint_format(self) -> None:
        """[K1] Tokens are <6>.<16> of [a-z0-9], and never repeat."""
        tokens = {mintToken().bearer for _ in range(500)}
        self.assertEqual(len(tokens), 500)
        for bearer in tokens:
            self.assertRegex(bearer, r"^[a-z0-9]{6}\.[a-z0-9]{16}$")

    def test_repr_hidesSecret(self) -> None:
        """A token's repr (logs, tracebacks) never shows its secret part."""
        token = mintToken()
        self.assertNotIn(token.secret, repr(token))

    def test_perNodeToken_neverTalosGroup(self) -> None:
        """[K1] A per-node token cannot be put in Talos's auto-approve group."""
        self.assertRaises(
            ValueError,
            tokenSecret,
            mintToken(),
            description="d",
            expiresAt=1.0,
            group=TALOS_GROUP,
        )

    def test_sealer_roundTrip_boundToId(self) -> None:
        """The sealed cluster token opens only under its own id."""
        sealer = Sealer(b"s" * 32)
        token = mintToken()
        sealed = sealer.seal(token)
        self.assertNotIn(token.secret.encode(), sealed)
        self.assertEqual(sealer.open(token.id, sealed), token)
        self.assertRaises(InvalidTag, sealer.open, "zzzzzz", sealed)


class IssueTests(SynchronousTestCase):
    """Provisions with a cluster configured."""

    def setUp(self) -> None:
        self.fleet = KubeFleet(self)
        self.addCleanup(self.fleet.stopKube)
        self.fleet.add(device("w1", "SER1"), device("w2", "SER2"))

    def test_provision_secretPerNode(self) -> None:
        """
        [K1] Each worker configuration carries its own token; its Secret is
        a bootstrap token for authentication only, in fleetd's own group,
        with an expiration (24 h by default) and a description naming the
        device and run.
        """
        runs = self.fleet.provision(device("w1", "SER1"), device("w2", "SER2"))
        bearers = [self.fleet.bearer(r.run) for r in runs]
        self.assertNotEqual(bearers[0], bearers[1])
        run, bearer = runs[0], bearers[0]
        tokenId = bearer.split(".")[0]
        secret = self.fleet.fake.secrets[f"bootstrap-token-{tokenId}"]
        self.assertEqual(secret["type"], TOKEN_TYPE)
        data = secretData(self.fleet.fake, tokenId)
        self.assertEqual(data["auth-extra-groups"], NODE_GROUP)
        self.assertEqual(data["usage-bootstrap-authentication"], "true")
        self.assertNotIn("usage-bootstrap-signing", data)
        self.assertEqual(data["expiration"], "1970-01-02T00:00:00Z")
        self.assertIn("w1", data["description"])
        self.assertIn(run.run, data["description"])
        who = self.fleet.fake.authenticate(bearer)
        assert who is not None
        self.assertEqual(who.username, f"system:bootstrap:{tokenId}")
        record = self.fleet.token(tokenId)
        assert record is not None
        self.assertEqual((record.device, record.run), ("w1", run.run))
        self.assertEqual(record.expires_at, 86400.0)

    def test_secretPart_neverJournaledOrStored(self) -> None:
        """[K1] The journal records the token id only; the database never the secret."""
        (run,) = self.fleet.provision(device("w1", "SER1"))
        bearer = self.fleet.bearer(run.run)
        tokenId, secret = bearer.split(".")
        (issued,) = self.fleet.entries("kube.token-issued")
        self.assertEqual(issued.fields["bootstrap_id"], tokenId)
        for entry in self.successResultOf(self.fleet.journal.query()):
            self.assertNotIn(secret, repr(entry.toJSON()))
        dump = "\n".join(self.fleet.db.connection.iterdump())
        self.assertNotIn(secret, dump)

    def test_reprovision_deletesUnapprovedToken(self) -> None:
        """A new provision supersedes the old run's unapproved token: deleted now."""
        (old,) = self.fleet.provision(device("w1", "SER1"))
        oldId = self.fleet.bearer(old.run).split(".")[0]
        self.fleet.provision(device("w1", "SER1"))
        self.fleet.fake.flush()
        self.assertNotIn(f"bootstrap-token-{oldId}", self.fleet.fake.secrets)
        record = self.fleet.token(oldId)
        assert record is not None and record.deleted_at is not None
        self.assertEqual(
            [
                e.fields["bootstrap_id"]
                for e in self.fleet.entries("kube.token-superseded")
            ],
            [oldId],
        )

    def test_apiDown_nothingProvisioned(self) -> None:
        """[J1] The Secret cannot be created: no run, no row, no file, no entry."""
        self.fleet.fake.reachable = False
        d = Deferred.fromCoroutine(
            self.fleet.registry.provision(
                [device("w1", "SER1")],
                actor="owner:test",
                render=lambda d, run, token=None: RENDERER.render(
                    None, NodeFacts(d.name, d.device_class, run, bootstrap_token=token)
                ),
                credentials=self.fleet.kube.book,
            )
        )
        self.failureResultOf(d, KubeUnavailable)
        self.assertIsNone(self.fleet.registry.current("w1"))
        self.assertEqual(self.fleet.vault.names(), [])
        self.assertEqual(self.fleet.events(), [])
        self.assertEqual(self.fleet.status("w1"), DeviceStatus.INVENTORY)

    def test_commitFails_secretDeleted(self) -> None:
        """[J1] The provision's commit fails: the Secret it created is deleted."""
        faults = self.fleet.faults()
        faults.runner.failing = sqlite3.OperationalError("disk I/O error")
        d = Deferred.fromCoroutine(
            self.fleet.registry.provision(
                [device("w1", "SER1")],
                actor="owner:test",
                render=lambda d, run, token=None: RENDERER.render(
                    None, NodeFacts(d.name, d.device_class, run, bootstrap_token=token)
                ),
                credentials=self.fleet.kube.book,
            )
        )
        self.fleet.fake.flush()
        self.failureResultOf(d, sqlite3.OperationalError)
        faults.clear()
        self.assertEqual(self.fleet.fake.secrets, {})
        self.assertEqual(self.fleet.vault.names(), [])
        self.assertIsNone(self.fleet.registry.current("w1"))

    def test_journalRefuses_secretDeleted(self) -> None:
        """[J1] The journal refuses the provision's entries: the Secret goes too."""
        from fleetd.store.db import StoreError

        faults = self.fleet.faults()
        faults.journal.failing = StoreError("journal head is not authentic")
        d = Deferred.fromCoroutine(
            self.fleet.registry.provision(
                [device("w1", "SER1")],
                actor="owner:test",
                render=lambda d, run, token=None: RENDERER.render(
                    None, NodeFacts(d.name, d.device_class, run, bootstrap_token=token)
                ),
                credentials=self.fleet.kube.book,
            )
        )
        self.fleet.fake.flush()
        self.failureResultOf(d, StoreError)
        faults.clear()
        self.assertEqual(self.fleet.fake.secrets, {})
        self.assertEqual(self.fleet.entries("kube.token-issued"), [])

    def test_noCluster_templateTokenKept(self) -> None:
        """Without [kubernetes] the configuration keeps the template's cluster.token."""
        from tests.fleetsupport import Fleet

        plain = Fleet(self)
        plain.add(device("w1", "SER1"))
        (run,) = plain.provision(device("w1", "SER1"))
        body = plain.vault.get(f"{run.run}.yaml")
        assert body is not None
        kept = DEV_VALUES.value("REPLACE-WITH-BOOTSTRAP-TOKEN")  # the template's
        self.assertIn(b"token: " + kept.encode(), body)

    def test_commitFails_discardFails_expiryBackstop(self) -> None:
        """
        [J1] The commit fails and so does deleting the Secret: the provision
        still fails cleanly; the Secret is left to its expiration.
        """
        faults = self.fleet.faults()
        faults.runner.failing = sqlite3.OperationalError("disk I/O error")
        self.fleet.fake.failNext("DELETE", "/secrets/", 503)
        d = Deferred.fromCoroutine(
            self.fleet.registry.provision(
                [device("w1", "SER1")],
                actor="owner:test",
                render=lambda d, run, token=None: RENDERER.render(
                    None, NodeFacts(d.name, d.device_class, run, bootstrap_token=token)
                ),
                credentials=self.fleet.kube.book,
            )
        )
        self.fleet.fake.flush()
        self.failureResultOf(d, sqlite3.OperationalError)
        faults.clear()
        (secret,) = self.fleet.fake.secrets.values()
        self.assertIn("expiration", secret["data"])
        self.assertIsNone(self.fleet.registry.current("w1"))
