"""Does a heavy read stall the engine for every other client? A tenant's ``insert_one``
beside the memory service's heaviest searches at 100,000 memories (issue 22, item 4:
target p99 <= 50 ms).

Data: tenant ``big`` holds N memories (default 100,000; 50 namespaces; one 64-dimension
vector each, in ``memory_vectors``) written as the memory service stores them, behind the
service's own indexes (``setup()``). The engine runs in its own process, fsync on, and is
restarted once loaded (so the load's journal is in its tables before anything is timed).

Each turn has two phases of ``--seconds``:

- alone: another tenant's ``insert_one`` into the same collection, one after the other;
- during heavy searches: the same, while two other processes run the service's heaviest
  searches back to back: a search without a query whose value filter matches nothing
  (every memory of the tenant is read, newest first: 7 s on the engine before issue 22),
  and a search with a query and such a filter (the vector search widens to 10,000
  candidates and reads them).

The inserting client is alone in this process, so its latency is the engine's (a client
decoding a search's 16 MB batches would stall its own threads). The turns' results are
pooled; the p99 of each turn is shown as a range. ``--baseline REV`` runs the same on the
engine and memory service of git revision REV (its own process, its own copy of the data),
phase by phase in turn with the current one. Run alone: ``python -m benchmarks.engine_reads
[--memories N] [--seconds S] [--turns T] [--baseline REV]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from benchmarks.engine_proc import EngineProcess, baseline

MEMORIES = 100_000
SECONDS = 15.0
TURNS = 3
TARGET_P99_MS = 50.0
WORKER = Path(__file__).resolve().parent / "engine_reads_worker.py"
SEARCHES = ("scan", "vector")


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Side:
    """One engine (current or a baseline revision) with its data and memory service."""

    def __init__(self, label: str, root: Path, source: Path | None) -> None:
        self.label = label
        self.source = source
        self.engine = EngineProcess(root / label.replace(" ", "-"), source=source)
        self.alone: list[float] = []
        self.during: list[float] = []
        self.turn_p99: dict[str, list[float]] = {"alone": [], "during": []}
        self.searches: dict[str, list[float]] = {kind: [] for kind in SEARCHES}
        self.lock: dict[str, Any] = {}
        self._next = 0

    def _worker(self, *args: str) -> subprocess.Popen[str]:
        env = dict(os.environ)
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
        else:
            env.pop("PYTHONPATH", None)
        return subprocess.Popen(
            [sys.executable, str(WORKER), self.engine.uri, *args],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip

    def load(self, memories: int) -> float:
        self.engine.start()
        started = time.perf_counter()
        setup = self._worker("setup", str(memories))
        if setup.wait() != 0:
            raise RuntimeError(f"[{self.label}] loading the memories failed")
        load_s = time.perf_counter() - started
        self.engine.restart()
        return load_s

    def _inserts(self, client: MongoClient, seconds: float) -> list[float]:
        coll = client.bench.long_term_memory
        latencies: list[float] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._next += 1
            doc = {"_id": f"small:{self._next}", "tenant_id": "small", "namespace": ["users", "s"],
                   "key": f"k{self._next}", "value": {"n": self._next}, "kind": "item",
                   "updated_at": time.time()}  # fmt: skip
            started = time.perf_counter()
            coll.insert_one(doc)
            latencies.append(time.perf_counter() - started)
        return latencies

    def phase_alone(self, seconds: float) -> None:
        with self.engine.client() as client:
            latencies = self._inserts(client, seconds)
        self.alone += latencies
        self.turn_p99["alone"].append(_pct(latencies, 99))

    def phase_during(self, seconds: float) -> None:
        # The searches go on a little longer than the inserts, so that every insert has them beside it.
        workers = [self._worker(kind, str(seconds + 1.0)) for kind in SEARCHES]
        try:
            for w in workers:
                assert w.stdout is not None
                if w.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"[{self.label}] a search worker did not start")
            time.sleep(0.5)  # each has its first search under way
            with self.engine.client() as client:
                latencies = self._inserts(client, seconds)
        finally:
            for w in workers:
                assert w.stdout is not None
                for line in w.stdout:
                    done = json.loads(line)
                    self.searches[done["search"]].append(done["s"])
                if w.wait() != 0:
                    raise RuntimeError(f"[{self.label}] a search worker failed")
        self.during += latencies
        self.turn_p99["during"].append(_pct(latencies, 99))

    def finish(self) -> None:
        with self.engine.client() as client:
            status = client.admin.command("serverStatus").get("accordEngine") or {}
        self.lock = status.get("lock", {})
        self.engine.stop()


def measure(memories: int, seconds: float, turns: int, baseline_rev: str | None) -> list[Side]:
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        sides = [Side("current", Path(tmp), None)]
        if baseline_rev:
            sides.append(Side(f"baseline {baseline_rev[:8]}", Path(tmp), baseline(baseline_rev)))
        for side in sides:
            stack.callback(side.engine.stop)
            load_s = side.load(memories)
            print(f"  [{side.label}] {memories:,} memories loaded in {load_s:.0f} s", flush=True)
        for turn in range(turns):
            for side in sides:
                side.phase_alone(seconds)
                side.phase_during(seconds)
                print(
                    f"  [{side.label}] turn {turn + 1}: insert p99 "
                    f"{side.turn_p99['alone'][-1] * 1000:.1f} ms alone, "
                    f"{side.turn_p99['during'][-1] * 1000:.1f} ms during heavy searches",
                    flush=True,
                )
        for side in sides:
            side.finish()
        return sides


def render(sides: list[Side], memories: int, seconds: float, turns: int) -> str:
    lines = [
        "### Embedded engine: a tenant's insert_one beside heavy memory searches",
        "",
        f"Run alone: `python -m benchmarks.engine_reads` (`--baseline REV` adds the engine and "
        f"memory service of git revision REV, in turn). {memories:,} memories of one tenant "
        f"behind the memory service's indexes; another tenant's `insert_one` into the same "
        f"collection, one after the other, from a process of its own; engine in its own "
        f"process, fsync on. {turns} turns of {seconds:.0f} s alone, then {seconds:.0f} s while "
        f"two other processes run the service's heaviest searches back to back (a search "
        f"without a query and a value filter that matches nothing: every memory read newest "
        f"first; a search with a query and such a filter: the vector search widens to 10,000 "
        f"candidates). Client-side milliseconds over all turns; the p99 of each turn as a "
        f"range. Target: p99 <= {TARGET_P99_MS:.0f} ms during heavy searches.",
        "",
        "| engine | inserts | count | p50 ms | p99 ms | p99 per turn | max ms | p99 vs alone |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for side in sides:
        alone_p99 = _pct(side.alone, 99)
        for name, key, xs in (
            ("alone", "alone", side.alone),
            ("during heavy searches", "during", side.during),
        ):
            per_turn = side.turn_p99[key]
            lines.append(
                f"| {side.label} | {name} | {len(xs)} | {statistics.median(xs) * 1000:.1f} "
                f"| {_pct(xs, 99) * 1000:.1f} | {min(per_turn) * 1000:.1f}-{max(per_turn) * 1000:.1f} "
                f"| {max(xs) * 1000:.1f} | {_pct(xs, 99) / alone_p99:.1f}x |"
            )
    lines += [
        "",
        "| engine | search | done | median s | longest s | longest engine-lock hold of that "
        "command, wall / CPU ms |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for side in sides:
        kinds = side.lock.get("maxHoldByKind", {})
        for kind, label in (("scan", "without a query"), ("vector", "with a query")):
            xs = side.searches[kind]
            holds = ", ".join(
                f"{cmd} {kinds[cmd]['wallMillis']:.1f} / {kinds[cmd]['cpuMillis']:.1f}"
                for cmd in (("find", "getMore") if kind == "scan" else ("aggregate",))
                if cmd in kinds
            )
            lines.append(
                f"| {side.label} | {label} | {len(xs)} | {statistics.median(xs):.2f} "
                f"| {max(xs):.2f} | {holds or 'not reported'} |"
            )
    for side in sides:
        hist = side.lock.get("histogram") or {}
        if hist:
            lines += [
                "",
                f"{side.label}: longest engine-lock hold over the turns "
                f"{side.lock['maxHoldMillis']:.1f} ms ({side.lock['maxHoldBy']}); holds by wall "
                "time: " + ", ".join(f"{k} {v}" for k, v in hist.items()) + ".",
            ]
    during = _pct(sides[0].during, 99) * 1000
    verdict = "met" if during <= TARGET_P99_MS else "NOT met"
    lines += [
        "",
        f"Target (p99 <= {TARGET_P99_MS:.0f} ms during heavy searches, current engine): "
        f"{verdict} in this run ({during:.1f} ms).",
    ]
    return "\n".join(lines) + "\n"


def report(
    memories: int = MEMORIES, seconds: float = SECONDS, turns: int = TURNS,
    baseline_rev: str | None = None,
) -> str:  # fmt: skip
    baseline_rev = baseline_rev or os.environ.get("ACCORD_BENCH_BASELINE") or None
    sides = measure(memories, seconds, turns, baseline_rev)
    return render(sides, memories, seconds, turns)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_reads")
    parser.add_argument("--memories", type=int, default=MEMORIES)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--baseline", default=None, help="git revision to compare with")
    args = parser.parse_args()
    print(report(args.memories, args.seconds, args.turns, args.baseline))


if __name__ == "__main__":
    main()
