"""Child process of the crash suite: commits transactions until the engine dies.

Each transaction writes three documents in two collections and bumps a counter; after
the commit is acknowledged its number is appended to the ack file (flushed), so the parent
knows exactly which commits the client saw succeed.

``python crash_driver.py URI ACK_FILE FIRST [THREADS]``: with several threads (to make
the engine group-commit), thread ``t`` commits numbers ``FIRST + t``, ``FIRST + t +
THREADS``, ... and bumps its own counter document ``c-t`` (so the threads do not
serialise on one document). The driver prints ``ready`` once it has reached the engine,
so the parent's random kill lands among commits, not during Python's start-up.

When the engine dies the driver exits at once (``os._exit`` with the ack file flushed,
under the ack lock so no line is half written): going through pymongo's clean-up instead
(aborting the open transaction, ending sessions) waits for server selection to time out,
seconds per kill that made the suite slow enough to time out on a loaded machine. An
acknowledgement that one thread received just before another thread exits may go
unrecorded; that only makes the check weaker for that commit, never wrong.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, NoReturn

from pymongo import MongoClient
from pymongo.errors import ConnectionFailure, PyMongoError

# How long the driver keeps trying to reach a freshly started engine (slow when loaded).
REACH_S = 30.0


def exit_now(acks: IO[str], lock: threading.Lock) -> NoReturn:
    """The engine was killed: stop every thread now, keeping each recorded ack whole."""
    with lock:
        acks.flush()
        os._exit(0)


def commit_loop(
    client: MongoClient, acks: IO[str], lock: threading.Lock, first: int, step: int, counter: str
) -> None:
    db = client.crash
    n = first
    while True:
        session = client.start_session()
        try:
            session.start_transaction()
            db.a.insert_one({"_id": f"{n}-0", "txn": n, "pad": "x" * 200}, session=session)
            db.a.insert_one({"_id": f"{n}-1", "txn": n}, session=session)
            db.b.insert_one({"_id": f"{n}-2", "txn": n}, session=session)
            db.counter.update_one(
                {"_id": counter}, {"$inc": {"n": 1}}, upsert=True, session=session
            )
            session.commit_transaction()
        except ConnectionFailure:
            exit_now(acks, lock)  # the engine was killed: the parent takes over
        except PyMongoError as exc:
            if exc.has_error_label("TransientTransactionError"):
                session.end_session()  # a write conflict: it did not happen, try again
                continue
            raise
        with lock:
            acks.write(f"{n}\n")
        session.end_session()
        n += step


def reach(client: MongoClient) -> bool:
    deadline = time.monotonic() + REACH_S
    while True:
        try:
            client.admin.command("ping")
            return True
        except PyMongoError:
            if time.monotonic() > deadline:
                return False


def main(uri: str, ack_path: str, first: int, threads: int = 1) -> None:
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=2000, retryWrites=False)
    if not reach(client):
        return
    print("ready", flush=True)
    lock = threading.Lock()
    with open(ack_path, "a", buffering=1) as acks:
        workers = [
            threading.Thread(
                target=commit_loop,
                args=(client, acks, lock, first + t, threads, "c" if threads == 1 else f"c-{t}"),
            )
            for t in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1)
