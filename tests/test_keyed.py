"""Code digests through the precomputed HMAC are the standard HMAC."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from fleetd.runs.codes import codeDigest


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
