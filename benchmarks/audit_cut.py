"""The audit class's retention: how fast expired audit records are cut, and what
verifying costs after the cut.

An embedded engine (``--no-sync``) gets STREAMS x PER audit records: PER transactions,
each writing one business document into each of STREAMS collections (one record per
collection's stream), through a kernel with the audit on. A digest commits to the heads;
then :func:`accord.governance.audit_cuts.cut_expired` runs as the sweep would, with its
clock past the 7-year period, and cuts every stream's records (one transaction per
stream: the cut, the deletion, its two records). Printed: records written, seconds and
records cut per second, and ``verify_chain`` before and after.

``python -m benchmarks.audit_cut [STREAMS] [PER]`` (default 20 x 1,000 = 20,000 records).
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta

from pymongo import MongoClient

from accord import runtime
from accord.governance.audit_cuts import cut_expired
from accord.governance.audit_hook import AuditHook
from accord.governance.digests import write_digest
from accord.governance.holds import Holds
from accord.governance.loading import default_policy
from accord.governance.verify import verify_chain
from accord.platform.context import AUDITOR, Principal, WriteContext
from accord.platform.plan import Group, Op, Plan
from benchmarks.checkpointer import start_engine

DB = "bench_audit_cut"


def main(streams: int = 20, per: int = 1000) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp)
        client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port}/?replicaSet=accord")
        try:
            writer = runtime.kernel(client, audit="metadata")
            started = time.perf_counter()
            for i in range(per):
                writer.execute(Plan(WriteContext("acme", operation="bench.write"), [
                    Group(f"w{s}", DB, f"orders{s}", "business",
                          [Op("insert", doc={"tenant_id": "acme", "n": i})])
                    for s in range(streams)
                ]))  # fmt: skip
            wrote = time.perf_counter() - started
            auditor = runtime.kernel(client, principal=Principal.service(AUDITOR),
                                     audit="metadata")  # fmt: skip
            t = time.perf_counter()
            before = verify_chain(auditor, DB)
            verify_before = time.perf_counter() - t
            write_digest(auditor, DB)
            admin = runtime.kernel(client, principal=Principal.os_user(), audit="metadata")
            later = datetime.now(UTC) + timedelta(days=8 * 366)  # the cuts are dated then
            # ... and the kernel runs then (it refuses a cut dated ahead of its clock)
            next(h for h in admin.hooks.all if isinstance(h, AuditHook)).clock = lambda: later
            t = time.perf_counter()
            report = cut_expired(admin, DB, default_policy(), Holds.of([]),
                                 principal=Principal.os_user(), now=later)  # fmt: skip
            cut = time.perf_counter() - t
            t = time.perf_counter()
            after = verify_chain(auditor, DB, now=later)
            verify_after = time.perf_counter() - t
        finally:
            client.close()
            proc.terminate()
            proc.wait()
    assert before.ok and after.ok, (before.breaks, after.breaks)
    figures = {
        "records": float(before.records), "write_s": wrote, "cut_streams": report.streams,
        "cut_records": report.records, "cut_s": cut, "cut_records_per_s": report.records / cut,
        "verify_before_s": verify_before, "records_after": float(after.records),
        "verify_after_s": verify_after,
    }  # fmt: skip
    return figures


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    for name, value in main(*args).items():
        print(f"{name:20} {value:,.2f}")
