"""What ``--auth`` costs a command: the same operations on an engine without auth and on one
with it, side by side in one run.

Two engines, each in its own process without fsync (so the privilege check is not hidden
behind the disk): one started plainly and used without a user, one started with ``--auth``
and used by a user whose custom role grants ``find``, ``insert`` and ``update`` on the one
collection it works on (governance's per-artifact-class roles look like this). One client
each; ``TURNS`` turns, each on two fresh engines started in alternating order, of ``OPS``
operations per engine and operation; the median latency per operation and the ratio
auth / no auth. Opening an authenticated connection (the SCRAM exchange, speculative in the
handshake, with pymongo deriving the key on the client side) is measured too.

``python -m benchmarks.engine_auth``
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pymongo import MongoClient

from benchmarks.engine_proc import EngineProcess

TURNS = 6
OPS = 400
CONNECTS = 20
ADMIN = ("bench_admin", "bench-admin-password")


def _engine(directory: Path, auth: bool) -> EngineProcess:
    engine = EngineProcess(directory, sync=False, args=("--auth",) if auth else ())
    if auth:
        os.environ["ACCORD_ENGINE_ADMIN_USER"], os.environ["ACCORD_ENGINE_ADMIN_PASSWORD"] = ADMIN
    try:
        engine.start()
    finally:
        os.environ.pop("ACCORD_ENGINE_ADMIN_USER", None)
        os.environ.pop("ACCORD_ENGINE_ADMIN_PASSWORD", None)
    return engine


def _client(engine: EngineProcess, auth: bool) -> MongoClient:
    if not auth:
        return MongoClient(engine.uri)
    admin = MongoClient(engine.uri, username=ADMIN[0], password=ADMIN[1])
    admin.app.command(
        "createRole",
        "worker",
        privileges=[
            {"resource": {"db": "app", "collection": "c"}, "actions": ["find", "insert", "update"]}
        ],
        roles=[],
    )
    admin.app.command("createUser", "svc", pwd="svc-password", roles=["worker"])
    admin.close()
    return MongoClient(engine.uri, username="svc", password="svc-password", authSource="app")


def _timed(op: Callable[[int], object], n: int, start: int) -> list[float]:
    out = []
    for i in range(start, start + n):
        t = time.perf_counter()
        op(i)
        out.append(time.perf_counter() - t)
    return out


def measure() -> dict[str, dict[str, float]]:
    """Median microseconds per operation, per configuration."""
    results: dict[str, dict[str, list[float]]] = {"no auth": {}, "--auth": {}}
    for turn in range(TURNS):
        # Fresh engines every turn, started in alternating order: the engine started second
        # was measurably slower whichever it was (80 us per find_one on this machine), so
        # the order must not favour one configuration.
        names = ["no auth", "--auth"] if turn % 2 == 0 else ["--auth", "no auth"]
        with tempfile.TemporaryDirectory(prefix="accord-bench-auth-") as tmp:
            engines = {
                n: _engine(Path(tmp) / str(i), auth=n == "--auth") for i, n in enumerate(names)
            }
            try:
                for name in names:
                    _turn(engines[name], name == "--auth", turn, results[name])
            finally:
                for e in engines.values():
                    e.stop()
    return {
        name: {op: statistics.median(v) * 1e6 for op, v in ops.items()}
        for name, ops in results.items()
    }


def _turn(engine: EngineProcess, auth: bool, turn: int, into: dict[str, list[float]]) -> None:
    client = _client(engine, auth)
    coll = client.app.c
    coll.insert_many([{"_id": -i, "n": 0} for i in range(1, 1001)])
    ops: dict[str, Callable[[int], object]] = {
        "find_one by _id": lambda i: coll.find_one({"_id": -(i % 1000) - 1}),
        "insert_one": lambda i: coll.insert_one({"_id": i}),
        "update_one by _id": lambda i: coll.update_one(
            {"_id": -(i % 1000) - 1}, {"$inc": {"n": 1}}
        ),
    }
    _timed(ops["find_one by _id"], OPS // 4, 0)  # warm up
    for op_name, op in ops.items():
        into.setdefault(op_name, []).extend(_timed(op, OPS, 1))
    for _ in range(CONNECTS):
        t = time.perf_counter()
        fresh = (
            MongoClient(engine.uri, username="svc", password="svc-password", authSource="app")
            if auth
            else MongoClient(engine.uri)
        )
        fresh.app.c.find_one({"_id": -1})
        into.setdefault("new client + first find_one", []).append(time.perf_counter() - t)
        fresh.close()
    client.close()


def report() -> str:
    medians = measure()
    lines = [
        "### Embedded engine: what --auth costs a command",
        "",
        f"Median microseconds per operation, one client per engine, engines in their own "
        f"processes without fsync, {TURNS} turns (fresh engines, started in alternating order) of {OPS} operations each "
        f"({CONNECTS} new clients per turn). `--auth`: a user whose custom role grants find, "
        "insert and update on the collection. `python -m benchmarks.engine_auth`",
        "",
        "| operation | no auth (us) | --auth (us) | --auth / no auth |",
        "| --- | ---: | ---: | ---: |",
    ]
    for op, plain in medians["no auth"].items():
        auth = medians["--auth"][op]
        lines.append(f"| {op} | {plain:.0f} | {auth:.0f} | {auth / plain:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(report())
