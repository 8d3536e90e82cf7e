"""Tests for L{fleetd.sources}: what counts as one source."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from fleetd.sources import SourcePrefix, sourceKey


class SourceKeyTests(SynchronousTestCase):
    def test_ipv4_itself(self) -> None:
        """An IPv4 address is its own key."""
        self.assertEqual(sourceKey("192.0.2.7"), "192.0.2.7")

    def test_ipv6_groupedBy64(self) -> None:
        """IPv6 addresses in one /64 share a key; other /64s do not."""
        a = sourceKey("2001:db8:1:2::1")
        self.assertEqual(a, "2001:db8:1:2::/64")
        self.assertEqual(sourceKey("2001:db8:1:2:ffff:ffff:ffff:ffff"), a)
        self.assertNotEqual(sourceKey("2001:db8:1:3::1"), a)

    def test_ipv4Mapped_isIPv4(self) -> None:
        """An IPv4-mapped IPv6 address counts as the IPv4 address."""
        self.assertEqual(sourceKey("::ffff:192.0.2.7"), "192.0.2.7")

    def test_scoped_andOther(self) -> None:
        """A zone index is dropped; a non-address is used as given."""
        self.assertEqual(sourceKey("fe80::1%eth0"), "fe80::/64")
        self.assertEqual(sourceKey("/run/fleetd.sock"), "/run/fleetd.sock")


class SourcePrefixTests(SynchronousTestCase):
    """Sources are counted by prefix (issue 8, item 12; design.md, Listeners)."""

    def test_ipv4(self) -> None:
        """IPv4 /24 by default: the last octet does not matter (issue 8, item 12)."""
        prefix = SourcePrefix(24, 56)
        self.assertEqual(prefix("10.20.0.7"), prefix("10.20.0.200"))
        self.assertNotEqual(prefix("10.20.0.7"), prefix("10.20.1.7"))

    def test_oddLengths(self) -> None:
        """Prefix lengths that are not whole bytes mask the partial byte (issue 8)."""
        prefix = SourcePrefix(20, 60)
        self.assertEqual(prefix("10.20.0.1"), prefix("10.20.15.255"))
        self.assertNotEqual(prefix("10.20.0.1"), prefix("10.20.16.1"))
        self.assertEqual(prefix("2001:db8:0:10::1"), prefix("2001:db8:0:1f::1"))
        self.assertNotEqual(prefix("2001:db8:0:10::1"), prefix("2001:db8:0:20::1"))

    def test_ipv6(self) -> None:
        """IPv6 /56 for RRL, /64 for TCP caps; no scope ids (design.md, Listeners)."""
        rrl, tcp = SourcePrefix(24, 56), SourcePrefix(32, 64)
        self.assertEqual(rrl("2001:db8:0:1::1"), rrl("2001:db8:0:ff::2"))
        self.assertNotEqual(rrl("2001:db8:0:1::1"), rrl("2001:db8:0:100::1"))
        self.assertEqual(tcp("2001:db8::1"), tcp("2001:db8::ffff:2"))
        self.assertNotEqual(tcp("2001:db8::1"), tcp("2001:db8:0:1::1"))
        self.assertEqual(tcp("fe80::1%lo"), tcp("fe80::2"))

    def test_mappedAndFamilies(self) -> None:
        """
        A v4-mapped v6 address counts as IPv4; families never collide
        (design.md, Listeners).
        """
        prefix = SourcePrefix(32, 64)
        self.assertEqual(prefix("::ffff:10.0.0.1"), prefix("10.0.0.1"))
        self.assertNotEqual(prefix("::a00:1"), prefix("10.0.0.1"))
        self.assertEqual(prefix("not an address"), "not an address")
