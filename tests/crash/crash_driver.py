"""Child process of the crash suite: commits transactions until the engine dies.

Each transaction writes three documents in two collections and bumps a counter; after
the commit is acknowledged its number is appended to the ack file (flushed), so the parent
knows exactly which commits the client saw succeed.

``python crash_driver.py URI ACK_FILE FIRST [THREADS]``: with several threads (to make
the engine group-commit), thread ``t`` commits numbers ``FIRST + t``, ``FIRST + t +
THREADS``, ... and bumps its own counter document ``c-t`` (so the threads do not
serialise on one document). The driver prints ``ready`` once it has reached the engine,
so the parent's random kill lands among commits, not during Python's start-up.
"""

from __future__ import annotations

import sys
import threading

from pymongo import MongoClient
from pymongo.errors import ConnectionFailure, PyMongoError


def commit_loop(
    client: MongoClient, acks, lock: threading.Lock, first: int, step: int, counter: str
) -> None:  # type: ignore[no-untyped-def]
    db = client.crash
    n = first
    while True:
        try:
            with client.start_session() as session, session.start_transaction():
                db.a.insert_one({"_id": f"{n}-0", "txn": n, "pad": "x" * 200}, session=session)
                db.a.insert_one({"_id": f"{n}-1", "txn": n}, session=session)
                db.b.insert_one({"_id": f"{n}-2", "txn": n}, session=session)
                db.counter.update_one(
                    {"_id": counter}, {"$inc": {"n": 1}}, upsert=True, session=session
                )
        except ConnectionFailure:
            return  # the engine was killed: the parent takes over
        except PyMongoError as exc:
            if exc.has_error_label("TransientTransactionError"):
                continue  # a write conflict: the transaction did not happen, try again
            raise
        with lock:
            acks.write(f"{n}\n")
        n += step


def main(uri: str, ack_path: str, first: int, threads: int = 1) -> None:
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=2000, retryWrites=False)
    try:
        client.admin.command("ping")
    except PyMongoError:
        return
    print("ready", flush=True)
    lock = threading.Lock()
    with open(ack_path, "a", buffering=1) as acks:
        if threads == 1:
            commit_loop(client, acks, lock, first, 1, "c")
            return
        workers = [
            threading.Thread(
                target=commit_loop, args=(client, acks, lock, first + t, threads, f"c-{t}")
            )
            for t in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1)
