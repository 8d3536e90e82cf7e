"""
Server-side attestations per second (issue 9): EK chain, EK/AK checks,
binding lookup, MakeCredential, activation check, certify check, CSR
checks and LDevID issuance with its record and journal entry, on one core.

The nodes' messages are made beforehand in software (tests/softtpm.py:
the same structures swtpm produces), so only fleetd's side is timed.
Run: .venv/bin/python bench/attest_rate.py --nodes 300
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from twisted.internet.defer import Deferred

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetd.attest.tpm import ekDigest, spkiOf
from tests.attestserver import AttestServer
from tests.softtpm import SoftNode


def result(d: Deferred[Any]) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=300)
    options = parser.parse_args()
    server = AttestServer(Path(tempfile.mkdtemp(prefix="attest-bench-")))
    ca = x509.load_pem_x509_certificate(server.pki.ek_ca.read_bytes())
    key = serialization.load_pem_private_key(server.pki.ek_ca_key.read_bytes(), None)
    nodes = []
    for i in range(options.nodes):
        node = SoftNode(ca, key, serial=f"SER{i}")
        server.addDevice(f"w{i}", node.serial)
        server.bindings.approved[ekDigest(spkiOf(node.ekPublic))] = node.serial
        nodes.append(node)
    service = server.service
    beginTime = proveTime = wall = 0.0
    for node in nodes:
        claim = node.claim()
        start, clock = time.process_time(), time.perf_counter()
        challenge = result(Deferred.fromCoroutine(service.begin(claim)))
        beginTime += time.process_time() - start
        wall += time.perf_counter() - clock
        proof = node.proof(challenge)  # the node's work: not timed
        start, clock = time.process_time(), time.perf_counter()
        result(Deferred.fromCoroutine(service.prove(proof)))
        proveTime += time.process_time() - start
        wall += time.perf_counter() - clock
    total = beginTime + proveTime
    n = options.nodes
    print(
        f"nodes {n}: begin {beginTime / n * 1000:.2f} ms, prove+issue "
        f"{proveTime / n * 1000:.2f} ms, {n / total:.0f} attestations/s per core "
        f"(CPU time); {n / wall:.0f}/s wall (SQLite fsync included)"
    )
    server.service.stop()
    server.db.close()


if __name__ == "__main__":
    main()
