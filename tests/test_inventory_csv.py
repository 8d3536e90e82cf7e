"""Tests for L{fleetd.inventory.csvimport.parseDeviceCSV}."""

from __future__ import annotations

import csv
import io

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from fleetd.inventory import Device, InventoryError, parseDeviceCSV, validateDevice

UUID1 = "4c4c4544-0042-3510-8052-b4c04f384833"
UUID2 = "4c4c4544-0042-3510-8052-b4c04f384834"
UUID3 = "4c4c4544-0042-3510-8052-b4c04f384835"

GOOD = f"""\
name,serial,uuid,mac,class,cluster
w1,SN-1,{UUID1},52:54:00:00:00:01,worker-g3,folly
w2,SN-2,{UUID2.upper()},52-54-00-00-00-02 525400000012,worker-g3,
W3,SN-3,{UUID3},,control-plane,folly
"""


class ParseDeviceCSVTests(SynchronousTestCase):
    """Good files parse to devices; a bad row rejects the file with its line."""

    def refused(self, text: str) -> str:
        with self.assertRaises(InventoryError) as caught:
            parseDeviceCSV(text)
        message = str(caught.exception)
        self.assertEqual(caught.exception.kind, "invalid")
        self.assertNotIn("\n", message)
        return message

    def test_goodFile_devicesNormalised(self) -> None:
        """A good file gives one normalised device per row, in file order."""
        devices = parseDeviceCSV(GOOD)
        self.assertEqual([d.name for d in devices], ["w1", "w2", "w3"])
        self.assertEqual(devices[1].uuid, UUID2)
        self.assertEqual(devices[1].cluster, None)
        self.assertEqual(devices[2].macs, ())
        self.assertEqual(devices[2].device_class, "control-plane")

    def test_multiMAC_spaceSeparated(self) -> None:
        """Several MACs in one cell, separated by spaces, keep their order."""
        devices = parseDeviceCSV(GOOD)
        self.assertEqual(devices[1].macs, ("52:54:00:00:00:02", "52:54:00:00:00:12"))

    def test_reorderedHeader_sameDevices(self) -> None:
        """Columns may come in any order; header names ignore case and spaces."""
        text = f"""\
Cluster, CLASS ,mac,uuid,serial,name
folly,worker-g3,52:54:00:00:00:01,{UUID1},SN-1,w1
"""
        self.assertEqual(parseDeviceCSV(text), parseDeviceCSV(GOOD)[:1])

    def test_optionalColumns_absent(self) -> None:
        """mac and cluster columns may be left out."""
        devices = parseDeviceCSV(f"name,serial,uuid,class\nw1,SN-1,{UUID1},worker\n")
        self.assertEqual((devices[0].macs, devices[0].cluster), ((), None))

    def test_blankLinesAndBOM_tolerated(self) -> None:
        """A BOM, blank lines and CRLF line ends are fine."""
        text = "\ufeff\r\n" + GOOD.replace("\n", "\r\n\r\n") + "  \r\n"
        self.assertEqual(parseDeviceCSV(text), parseDeviceCSV(GOOD))

    def test_headerOnly_noDevices(self) -> None:
        """A file with only a header parses to no devices."""
        self.assertEqual(parseDeviceCSV("name,serial,uuid,class\n"), [])

    def test_empty_refused(self) -> None:
        """An empty file has no header: refused on line 1."""
        self.assertTrue(self.refused("").startswith("line 1: no header"))

    def test_badRows_reportPhysicalLine(self) -> None:
        """Each kind of bad row rejects the file naming its line and field."""
        header = "name,serial,uuid,mac,class,cluster\n"
        ok = f"w1,SN-1,{UUID1},52:54:00:00:00:01,worker,folly\n"
        cases = [
            (f"w_2,SN-2,{UUID2},,worker,folly", "line 4: name:"),
            (f",SN-2,{UUID2},,worker,folly", "line 4: name: must not be empty"),
            (f"w2,SN 2,{UUID2},,worker,folly", "line 4: serial:"),
            ("w2,SN-2,not-a-uuid,,worker,folly", "line 4: uuid:"),
            (f"w2,SN-2,{UUID2},52:54:00:zz:00:02,worker,folly", "line 4: mac:"),
            (f"w2,SN-2,{UUID2},,Worker_G2,folly", "line 4: class:"),
            (f"w2,SN-2,{UUID2},,worker,fol/ly", "line 4: cluster:"),
            (f"w2,SN-2,{UUID2},,worker", "line 4: expected 6 fields, got 5"),
            (f"w2,SN-2,{UUID2},,worker,folly,x", "line 4: expected 6 fields, got 7"),
            (f'w2,SN-2,{UUID2},,worker,"fol"ly', "line 4: malformed CSV"),
        ]
        for row, expected in cases:
            text = header + ok + "\n" + row + "\n" + ok.replace("w1", "w9")
            message = self.refused(text)
            self.assertTrue(message.startswith(expected), (row, message))

    def test_quotedMultilineField_lineOfRowStart(self) -> None:
        """A bad row whose quoted cell spans lines is reported at its first line."""
        text = f'name,serial,uuid,class\nw1,"SN\n1",{UUID1},worker\n'
        self.assertTrue(self.refused(text).startswith("line 2: serial:"))

    def test_duplicateInFile_refused(self) -> None:
        """A name, serial (any case), UUID or MAC repeated in the file is a bad row."""
        header = "name,serial,uuid,mac,class\n"
        first = f"w1,SN-1,{UUID1},52:54:00:00:00:01,worker\n"
        cases = [
            (f"W1,SN-2,{UUID2},,worker", "duplicate name w1 (first on line 2)"),
            (f"w2,sn-1,{UUID2},,worker", "duplicate serial sn-1 (first on line 2)"),
            (f"w2,SN-2,{UUID1.upper()},,worker", "duplicate uuid"),
            (f"w2,SN-2,{UUID2},525400000001,worker", "duplicate mac 52:54:00:00:00:01"),
        ]
        for row, expected in cases:
            message = self.refused(header + first + row + "\n")
            self.assertTrue(message.startswith("line 3: "), message)
            self.assertIn(expected, message)

    def test_unknownColumn_refused(self) -> None:
        """An unknown header column rejects the file on line 1, naming it."""
        message = self.refused(f"name,serial,uuid,class,rack\nw1,S,{UUID1},w,r1\n")
        self.assertTrue(message.startswith("line 1: unknown column 'rack'"), message)

    def test_repeatedColumn_refused(self) -> None:
        """A column named twice rejects the file on line 1."""
        message = self.refused("name,serial,uuid,class,mac,mac\n")
        self.assertTrue(message.startswith("line 1: column 'mac' appears twice"))

    def test_missingRequiredColumn_refused(self) -> None:
        """Each required column missing from the header is named."""
        for missing in ("name", "serial", "uuid", "class"):
            columns = [c for c in ("name", "serial", "uuid", "class") if c != missing]
            message = self.refused(",".join(columns) + "\n")
            self.assertEqual(message, f"line 1: missing column {missing!r}")

    def test_headerAfterBlankLines_lineNumbers(self) -> None:
        """Blank lines before the header still count as physical lines."""
        message = self.refused("\n\nname,serial,uuid,class\nw1,S,bad,w\n")
        self.assertTrue(message.startswith("line 4: uuid:"), message)


_HEX = "0123456789abcdef"
_names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
_tokens = st.from_regex(r"[a-z0-9][a-z0-9-]{0,10}", fullmatch=True)
_serials = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E),
    min_size=1,
    max_size=64,
)
_uuids = st.uuids().map(str).filter(lambda u: u.strip("0-") and u.strip("f-"))
_macs = (
    st.integers(0, 2**48 - 1)
    .map(lambda n: ":".join(f"{b:02x}" for b in (n & ~(1 << 40)).to_bytes(6, "big")))
    .filter(lambda m: m != "00:00:00:00:00:00")
)


@st.composite
def deviceLists(draw: st.DrawFn) -> list[Device]:
    """Valid devices with fleet-unique names, serials, UUIDs and MACs."""
    names = draw(st.lists(_names, max_size=8, unique=True))
    count = len(names)
    serials = draw(
        st.lists(_serials, min_size=count, max_size=count, unique_by=str.lower)
    )
    uuids = draw(st.lists(_uuids, min_size=count, max_size=count, unique=True))
    macs = draw(st.lists(_macs, max_size=3 * count, unique=True))
    devices = []
    for i, name in enumerate(names):
        mine = macs[i::count] if count else []
        cluster = draw(st.none() | _tokens)
        devices.append(
            validateDevice(
                name=name,
                serial=serials[i],
                uuid=uuids[i],
                macs=mine,
                device_class=draw(_tokens),
                cluster=cluster,
            )
        )
    return devices


def writeCSV(devices: list[Device], columns: list[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    for d in devices:
        cells = {
            "name": d.name,
            "serial": d.serial,
            "uuid": d.uuid,
            "mac": " ".join(d.macs),
            "class": d.device_class,
            "cluster": d.cluster or "",
        }
        writer.writerow([cells[c] for c in columns])
    return out.getvalue()


class RoundTripTests(SynchronousTestCase):
    """Property: valid devices written with the csv module parse back equal."""

    @settings(max_examples=200, deadline=None)
    @given(
        deviceLists(),
        st.permutations(["name", "serial", "uuid", "mac", "class", "cluster"]),
    )
    def test_roundTrip_anyColumnOrder(
        self, devices: list[Device], columns: list[str]
    ) -> None:
        """Any valid devices, any column order: parse(write(devices)) == devices."""
        self.assertEqual(parseDeviceCSV(writeCSV(devices, columns)), devices)
