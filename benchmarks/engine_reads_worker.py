"""The memory service's side of ``benchmarks.engine_reads``, run in its own process.

Run as a script (``python benchmarks/engine_reads_worker.py URI MODE ...``) so that
``PYTHONPATH`` alone decides which accord it imports: the current one, or a baseline
revision's (its memory service and index definitions with its engine). It imports nothing
from ``benchmarks``.

Modes:

- ``setup N``: the memory service's collections and indexes (``setup()``), then N memories
  of tenant ``big`` (50 namespaces, a vector each) written as the service stores them;
- ``scan SECONDS`` / ``vector SECONDS``: the service's searches, back to back until
  SECONDS have passed, each printed as a JSON line ``{"search": kind, "s": seconds}``
  (``ready`` first): a search without a query, newest first, with a value filter that
  matches nothing (every memory of the tenant is read), or a query with such a filter
  (the vector search widens to 10,000 candidates).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta

import numpy as np
from pymongo import MongoClient

from accord.memory import model
from accord.memory.embedders import HashingEmbedder
from accord.memory.synchronous.service import MemoryService

DB = "bench"
DIMS = 64
TENANT = "big"
NOTHING = {"n": -1}  # a value filter no memory matches


def service(client: MongoClient) -> MemoryService:
    return MemoryService(client, tenant_id=TENANT, db_name=DB, embedder=HashingEmbedder(DIMS))


def setup(client: MongoClient, n: int) -> None:
    svc = service(client)
    svc.setup()
    rng = np.random.default_rng(1)
    now = datetime.now(UTC).replace(microsecond=0)
    for lo in range(0, n, 5000):
        docs, vectors = [], []
        for i in range(lo, min(n, lo + 5000)):
            vec = rng.normal(size=DIMS)
            req = model.PutRequest(
                namespace=("users", f"u{i % 50}"), key=f"k{i}",
                value={"n": i, "note": f"memory number {i} of a busy tenant"},
                text=f"memory number {i} of a busy tenant", embedding=list(vec / np.linalg.norm(vec)),
            )  # fmt: skip
            doc = model.new_document(TENANT, req, now - timedelta(seconds=i % 3600), None)
            docs.append(doc)
            vectors += model.vector_documents(doc)
        svc.memories.insert_many(docs, ordered=False)
        svc.vectors.insert_many(vectors, ordered=False)


def search(client: MongoClient, kind: str, seconds: float) -> None:
    svc = service(client)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        if kind == "scan":
            found = svc.search((), filter=NOTHING, limit=10)
        else:
            found = svc.search((), query="what does a busy tenant remember", filter=NOTHING,
                               limit=10, include_unscored=False)  # fmt: skip
        assert not found
        print(json.dumps({"search": kind, "s": time.perf_counter() - started}), flush=True)


def main() -> None:
    uri, mode, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    client: MongoClient = MongoClient(uri)
    try:
        if mode == "setup":
            setup(client, int(arg))
        else:
            search(client, mode, float(arg))
    finally:
        client.close()


if __name__ == "__main__":
    main()
