"""The compliance export and its offline verification at 1M audit records: wall time and
peak RSS of ``accord audit export`` and ``accord audit verify DIR``, each run as the CLI
in a process of its own.

**Fixture.** One embedded engine process (``--no-sync``: the records are written to be
read, not to measure writes). The audit collections are created as ``accord audit
digest`` creates them (the catalog's setup of the audit hook's collections: validator and
indexes); then ``RECORDS`` records of tenant ``acme`` in ``STREAMS`` thread streams are built by
the audit hook's own record builder (:func:`~accord.governance.audit_records.group_body`
of a one-insert group, chained with
:func:`~accord.governance.audit_records.chain_hash`, as the hook's seal does) and written
with ``insert_many`` in batches of 10,000 (writing 1M records through the kernel, one
transaction per 200, takes an hour on this machine; the records are the same bytes),
the streams' heads set, and a digest taken through the kernel. So they verify: the
benchmark fails when an export does not.

**Measured.** Each command is a child process (the ``accord`` CLI, ``--uri`` of the
engine); wall time and peak RSS are its own (``os.wait4``'s rusage of that child). For
each format: ``accord audit export --tenant acme --format F --out DIR`` then
``accord audit verify DIR``.

``python -m benchmarks.audit_export [--records N] [--streams S] [--formats jsonl,csv]
[--data DIR]``: the default is 1,000,000 records in 100 streams, jsonl; ``--data DIR``
keeps the engine's files in DIR and reuses them when they hold the same fixture (the
fixture takes a few minutes to write).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bson import ObjectId
from pymongo import MongoClient, UpdateOne

from accord import runtime
from accord.governance.audit_records import (
    GENESIS,
    HEADS,
    RECORDS,
    chain_hash,
    group_body,
    stream_of,
)
from accord.platform.context import AUDITOR, Principal, WriteContext
from accord.platform.plan import Group, Op
from benchmarks.checkpointer import start_engine

DB = "audit_export_bench"
TENANT = "acme"
BATCH = 10_000
TARGET_SECONDS = 60
TARGET_RSS_MIB = 300


def _setup(client: MongoClient[Any]) -> None:
    """Create the audit collections as ``accord audit digest`` does before its first digest
    (validator, indexes: the export reads the ``tenant_stream_seq`` index in order)."""
    from accord.platform.synchronous.catalog import Catalog

    uow = runtime.kernel(client, audit="metadata")
    Catalog(uow.acting_as(Principal.os_user()), DB).setup("audit", {})


def generate(uri: str, records: int, streams: int) -> float:
    """Write the fixture (module docstring); returns the seconds it took."""
    started = time.perf_counter()
    client: MongoClient[Any] = MongoClient(uri)
    _setup(client)
    audit = client[DB][RECORDS]
    heads: dict[str, tuple[int, str]] = {}
    txn_base = ObjectId()
    pending: list[dict[str, Any]] = []
    at = datetime.now(UTC).replace(microsecond=0)
    for n in range(records):
        thread = f"t{n % streams:04d}"
        ctx = WriteContext(TENANT, thread_id=thread, operation="messages.write")
        doc = {"_id": f"m{n}", "tenant_id": TENANT, "thread_id": thread,
               "role": "user", "text": f"message {n} of a thread", "n": n}  # fmt: skip
        group = Group("g", DB, "short_term_memory", "short_term_memory", [Op("insert", doc=doc)])
        body = group_body(ctx, group, [(group.ops[0], None)], at=at,
                          txn=f"{txn_base}-{n // 200}", mode="metadata")  # fmt: skip
        stream = stream_of(TENANT, thread, "short_term_memory", "short_term_memory")
        seq, prev = heads.get(stream, (0, GENESIS))
        body.update(stream=stream, seq=seq + 1, prev=prev)
        body["hash"] = chain_hash(body)
        body["_id"] = ObjectId()
        heads[stream] = (seq + 1, body["hash"])
        pending.append(body)
        if len(pending) >= BATCH:
            audit.insert_many(pending, ordered=False)
            pending = []
            print(f"  {n + 1} records written ({time.perf_counter() - started:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
    if pending:
        audit.insert_many(pending, ordered=False)
    client[DB][HEADS].bulk_write([
        UpdateOne({"_id": s}, {"$set": {"seq": seq, "hash": h, "tenant_id": TENANT, "at": at}},
                  upsert=True)
        for s, (seq, h) in sorted(heads.items())
    ])  # fmt: skip
    from accord.governance.digests import write_digest

    write_digest(runtime.kernel(client, principal=Principal.service(AUDITOR)), DB)
    client.close()
    return time.perf_counter() - started


def _cpu_seconds(pid: int) -> float:
    """A live process's CPU seconds so far (user + system, ``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(argv: list[str], engine: int) -> dict[str, Any]:
    """Run ``argv`` as a child; its wall seconds, peak RSS (MiB) and CPU seconds, and
    the engine's (process ``engine``) CPU seconds meanwhile."""
    engine_before = _cpu_seconds(engine)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    assert proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout.read().decode(), proc.stderr.read().decode()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{stdout}\n{stderr}")
    return {"seconds": wall, "rss_mib": usage.ru_maxrss / 1024,
            "cpu": usage.ru_utime + usage.ru_stime, "stdout": stdout.strip(),
            "engine_cpu": _cpu_seconds(engine) - engine_before}  # fmt: skip


def _peak_rss_mib(pid: int) -> float:
    """A live process's peak RSS (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.audit_export")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--formats", default="jsonl")
    parser.add_argument("--data", type=Path, default=None)
    args = parser.parse_args()
    accord_cli = str(Path(sys.executable).with_name("accord"))
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp) / "data"
        marker = data / "audit-export-fixture.json"
        fixture = {"records": args.records, "streams": args.streams}
        reuse = marker.exists() and json.loads(marker.read_text()) == fixture
        if not reuse and data.exists():
            shutil.rmtree(data)
        data.mkdir(parents=True, exist_ok=True)
        proc, port = start_engine(str(data))
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet=accord"
        rows: list[tuple[str, str, dict[str, Any], float]] = []
        try:
            if reuse:
                print(f"reusing the fixture in {data}", file=sys.stderr)
            else:
                made = generate(uri, args.records, args.streams)
                marker.write_text(json.dumps(fixture))
                print(f"fixture: {args.records} records in {args.streams} streams written in "
                      f"{made:.0f} s (not measured below)", file=sys.stderr)  # fmt: skip
            for fmt in args.formats.split(","):
                out = Path(tmp) / f"export-{fmt}"
                shutil.rmtree(out, ignore_errors=True)
                common = ["--uri", uri, "--db", DB]
                exported = run([accord_cli, "audit", "export", "--tenant", TENANT,
                                "--format", fmt, "--out", str(out), *common], proc.pid)  # fmt: skip
                size = sum(p.stat().st_size for p in out.iterdir()) / 2**20
                # what the verifier's bounds on these two files are measured against
                print(f"{fmt}: manifest.json {(out / 'manifest.json').stat().st_size:,} B, "
                      f"digests.json {(out / 'digests.json').stat().st_size:,} B",
                      file=sys.stderr)  # fmt: skip
                rows.append(("export", fmt, exported, size))
                verified = run([accord_cli, "audit", "verify", str(out), "--json"], proc.pid)
                report = json.loads(verified["stdout"])
                assert report["ok"] and report["records"] == args.records, report
                rows.append(("verify", fmt, verified, size))
                shutil.rmtree(out)
            engine_peak = _peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait()
    print(f"\n`python -m benchmarks.audit_export --records {args.records} --streams "
          f"{args.streams} --formats {args.formats}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")  # fmt: skip
    print("| command | format | records | files MiB | wall s | records/s | CPU s | engine CPU s "
          "| peak RSS MiB | target (60 s, 300 MiB) |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for what, fmt, r, size in rows:
        met = r["seconds"] < TARGET_SECONDS and r["rss_mib"] < TARGET_RSS_MIB
        print(f"| accord audit {what} | {fmt} | {args.records:,} | {size:.0f} | "
              f"{r['seconds']:.1f} | {args.records / r['seconds']:,.0f} | {r['cpu']:.1f} | "
              f"{r['engine_cpu']:.1f} | "
              f"{r['rss_mib']:.0f} | {'met' if met else 'NOT met'} |")  # fmt: skip
    print(
        f"\nThe engine's own peak RSS (its process, start-up and fixture included): "
        f"{engine_peak:.0f} MiB."
    )


if __name__ == "__main__":
    main()
