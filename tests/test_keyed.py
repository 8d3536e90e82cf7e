"""Hot-path encodings (code digests, served marks) equal the standard ones."""

from __future__ import annotations

import hashlib
import hmac
import json

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory.model import ServedRecord
from fleetd.runs.codes import codeDigest
from fleetd.runs.vaultnames import servedJSON as _servedJSON


class CodeDigestTests(SynchronousTestCase):
    """L{codeDigest} is HMAC-SHA256(key, code), hex."""

    @given(
        key=st.binary(min_size=32, max_size=100),
        code=st.from_regex(r"[A-Za-z0-9_-]{16,64}", fullmatch=True),
    )
    def test_codeDigest_standardHMAC(self, key: bytes, code: str) -> None:
        """[C1] A code's stored digest is unchanged: codes minted before still work."""
        self.assertEqual(
            codeDigest(key, code),
            hmac.new(key, code.encode("ascii"), hashlib.sha256).hexdigest(),
        )


class ServedMarkTests(SynchronousTestCase):
    """The served mark's JSON, written out by hand, is json.dumps's."""

    @given(
        run=st.text(max_size=30),
        device=st.text(max_size=30),
        peer=st.text(max_size=40),
        at=st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 2**40),
    )
    def test_servedJSON_sameAsJSONDumps(
        self, run: str, device: str, peer: str, at: float
    ) -> None:
        """[C1] A mark written now reads back as before (and as restarts expect)."""
        record = {"run": run, "device": device, "served_at": at, "peer": peer}
        self.assertEqual(
            _servedJSON(ServedRecord(run, device, at, peer)),
            json.dumps(record).encode("utf-8"),
        )
