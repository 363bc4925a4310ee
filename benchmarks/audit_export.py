"""Throughput and peak memory of the compliance export and of its offline verification.

One embedded engine process (``--no-sync``: the records are written to be read, not to
measure writes); N audit records of one tenant in S thread streams, written through the
kernel with the audit on (plans of 200 single-insert groups: one record per group); a
digest; then, each in a child process of its own so that its peak RSS is its own:

- ``accord.governance.export.export`` (jsonl, 100,000 records per part) into a temporary
  directory, through the kernel: wall time, records/s, peak RSS (``ru_maxrss``);
- ``accord.governance.export_verify.verify_export`` of that directory (no database):
  wall time, records/s, peak RSS.

Issue 24's target is 1M records each under 60 s with RSS under 300 MB. The default size
(``python -m benchmarks.audit_export [RECORDS] [STREAMS]``, 100,000 in 100 streams) runs
in about a minute on a shared 2-core machine; the 1M figures it prints are an
extrapolation (linear in records: both stream one cursor or file; memory is per stream
and per part, not per record), labelled as such.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from accord import runtime
from accord.platform.context import AUDITOR, Principal, WriteContext
from accord.platform.plan import Group, Op, Plan
from benchmarks.checkpointer import start_engine

RECORDS = 100_000
STREAMS = 100
GROUPS = 200
DB = "audit_export_bench"
TENANT = "acme"
TARGET_RECORDS = 1_000_000


def generate(uri: str, records: int, streams: int) -> float:
    """Write ``records`` audit records (one per group) in ``streams`` thread streams."""
    client: MongoClient[Any] = MongoClient(uri)
    uow = runtime.kernel(client, audit="metadata")
    started = time.perf_counter()
    written = 0
    n = 0
    while written < records:
        size = min(GROUPS, records - written)
        ctx = WriteContext(TENANT, thread_id=f"t{n % streams}", operation="messages.write")
        groups = [
            Group(f"g{i}", DB, "short_term_memory", "short_term_memory", [
                Op("insert", doc={"_id": f"m{written + i}", "tenant_id": TENANT,
                                  "text": "a message of a thread", "n": written + i}),
            ])
            for i in range(size)
        ]  # fmt: skip
        uow.execute(Plan(ctx, groups))
        written += size
        n += 1
    from accord.governance.digests import write_digest

    write_digest(runtime.kernel(client, principal=Principal.service(AUDITOR)), DB)
    client.close()
    return time.perf_counter() - started


def child(phase: str, uri: str, out: str) -> None:
    """One measured phase, in this (child) process; prints its result as JSON."""
    import resource

    started = time.perf_counter()
    if phase == "export":
        from accord.governance.export import export

        client: MongoClient[Any] = MongoClient(uri)
        uow = runtime.kernel(client, principal=Principal.service(AUDITOR))
        manifest = export(uow, DB, Path(out), tenant=TENANT)
        count = manifest["records"]
        client.close()
    elif phase == "read":  # the floor: the same cursor, nothing done with the records
        from accord.governance.audit_records import RECORDS as AUDIT_RECORDS
        from accord.platform.context import ReadContext

        client = MongoClient(uri)
        uow = runtime.kernel(client, principal=Principal.service(AUDITOR))
        context = ReadContext(TENANT, principal=Principal.service(AUDITOR))
        count = sum(1 for _ in uow.iterate(
            context, "audit", DB, AUDIT_RECORDS, {"tenant_id": TENANT},
            sort=[("tenant_id", 1), ("stream", 1), ("seq", 1)], batch_size=1000,
        ))  # fmt: skip
        client.close()
    else:
        from accord.governance.export_verify import verify_export

        report = verify_export(Path(out))
        assert report.ok, [p.describe() for p in report.problems[:3]]
        count = report.records
    elapsed = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss_mib = usage.ru_maxrss / 1024  # KiB on Linux
    cpu = usage.ru_utime + usage.ru_stime  # this process's own CPU, imports included
    print(json.dumps({"phase": phase, "records": count, "seconds": elapsed, "cpu": cpu,
                      "rss_mib": rss_mib}))  # fmt: skip


def measure(uri: str, phase: str, out: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.audit_export", "--child", phase, uri, out],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(records: int = RECORDS, streams: int = STREAMS) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp)
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet=accord"
        try:
            made = generate(uri, records, streams)
            print(f"wrote {records} audit records in {streams} streams in {made:.1f} s "
                  f"(not measured below)")  # fmt: skip
            out = str(Path(tmp) / "export")
            rows = [measure(uri, p, out) for p in ("read", "export", "verify")]
            size = sum(p.stat().st_size for p in Path(out).iterdir()) / 2**20
        finally:
            proc.terminate()
            proc.wait()
    print(f"\n`python -m benchmarks.audit_export {records} {streams}` ({size:.0f} MiB exported)\n")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| phase | records | wall s | records/s | CPU s (client) | peak RSS MiB "
          "| 1M records, extrapolated from wall |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        rate = r["records"] / r["seconds"]
        print(f"| {r['phase']} | {r['records']} | {r['seconds']:.1f} | {rate:,.0f} | "
              f"{r['cpu']:.1f} | {r['rss_mib']:.0f} | {TARGET_RECORDS / rate:.0f} s |")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main(*(int(a) for a in sys.argv[1:3]))
