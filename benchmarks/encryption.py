"""Encryption's cost on a step: the same graph on two savers in one run, turns
interleaved, one on a database whose policy encrypts checkpoints, channel values, pending
writes and messages per subject (governance's encryption hook, data keys under a master
key), one on a database with the default policy (nothing encrypted). Both kernels are
``accord.runtime``'s, so everything but the encryption is the same.

Reported: the median ``invoke`` latency of each (savers with their thread cache, as
users run them) and the median ``get_state`` of a saver without the cache (every read
from the database, every value decrypted), and their ratios.

``python -m benchmarks.encryption [turns]``
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

from pymongo import MongoClient

from accord.governance.crypto import MASTER_KEY_ENV, MasterKey
from accord.governance.loading import parse_policy
from accord.runtime import Accord
from benchmarks.checkpointer import build_graph, human, start_engine

TURNS = 200
WARMUP = 10
POLICY = "\n".join(
    f'[classes.{c}]\nencryption = "subject"\n'
    for c in ("checkpoint", "checkpoint_blob", "checkpoint_write", "short_term_memory")
)


def latency(turns: int = TURNS) -> dict[str, dict[str, float]]:
    """Median seconds per invoke and per get_state, encrypted and not, interleaved."""
    before = os.environ.get(MASTER_KEY_ENV)
    os.environ[MASTER_KEY_ENV] = before or MasterKey.generate().text()
    try:
        return _latency(turns)
    finally:  # the other suites of `make bench` run without it
        if before is None:
            os.environ.pop(MASTER_KEY_ENV, None)


def _latency(turns: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_engine(tmp)
        client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port}/?replicaSet=accord")
        try:
            roots = {
                "encrypted": Accord(client=client, db_name="bench_enc",
                                    policy=parse_policy(POLICY, "<benchmark>")),
                "clear": Accord(client=client, db_name="bench_clear"),
            }  # fmt: skip
            graphs = {n: build_graph().compile(checkpointer=r.checkpointer())
                      for n, r in roots.items()}  # fmt: skip
            # get_state on savers without the thread cache: every read from the database
            readers = {n: build_graph().compile(checkpointer=r.checkpointer(cache_threads=0))
                       for n, r in roots.items()}  # fmt: skip
            invoke: dict[str, list[float]] = {n: [] for n in graphs}
            state: dict[str, list[float]] = {n: [] for n in graphs}
            config: dict[str, Any] = {"configurable": {"thread_id": "t", "user_id": "u-1"}}
            for n in range(turns):
                for name in list(graphs) if n % 2 else list(reversed(graphs)):
                    started = time.perf_counter()
                    graphs[name].invoke(human(n), config)
                    invoke[name].append(time.perf_counter() - started)
                    started = time.perf_counter()
                    readers[name].get_state(config)
                    state[name].append(time.perf_counter() - started)
            raw = client["bench_enc"]["short_term_memory"].find_one({})
            assert raw is not None and b"question" not in bytes(raw["data"])  # ciphertext
            return {
                name: {"invoke": statistics.median(invoke[name][WARMUP:]),
                       "get_state": statistics.median(state[name][WARMUP:])}
                for name in graphs
            }  # fmt: skip
        finally:
            client.close()
            proc.terminate()
            proc.wait()


def report(turns: int = TURNS) -> str:
    m = latency(turns)
    r_inv = m["encrypted"]["invoke"] / m["clear"]["invoke"]
    r_get = m["encrypted"]["get_state"] / m["clear"]["get_state"]
    return "\n".join(
        [
            f"**Encryption's cost per step** ({turns} turns interleaved, a growing chat, "
            f"embedded engine --no-sync):",
            "",
            "| saver | median invoke | median get_state (no cache) |",
            "| --- | --- | --- |",
            f"| nothing encrypted | {m['clear']['invoke'] * 1e3:.2f} ms | "
            f"{m['clear']['get_state'] * 1e3:.2f} ms |",
            f"| checkpoints, values, writes, messages encrypted per subject | "
            f"{m['encrypted']['invoke'] * 1e3:.2f} ms | {m['encrypted']['get_state'] * 1e3:.2f} ms |",
            f"| ratio | {r_inv:.2f}x | {r_get:.2f}x |",
        ]
    )


if __name__ == "__main__":
    print(report(int(sys.argv[1]) if len(sys.argv) > 1 else TURNS))
