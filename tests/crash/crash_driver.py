"""Child process of the crash suite: commits transactions until the engine dies.

Each transaction writes three documents in two collections and bumps a counter; after
the commit is acknowledged its number is appended to the ack file (flushed), so the parent
knows exactly which commits the client saw succeed.
"""

from __future__ import annotations

import sys

from pymongo import MongoClient
from pymongo.errors import PyMongoError


def main(uri: str, ack_path: str, first: int) -> None:
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=500, retryWrites=False)
    db = client.crash
    with open(ack_path, "a", buffering=1) as acks:
        n = first
        while True:
            try:
                with client.start_session() as session, session.start_transaction():
                    db.a.insert_one({"_id": f"{n}-0", "txn": n, "pad": "x" * 200}, session=session)
                    db.a.insert_one({"_id": f"{n}-1", "txn": n}, session=session)
                    db.b.insert_one({"_id": f"{n}-2", "txn": n}, session=session)
                    db.counter.update_one(
                        {"_id": "c"}, {"$inc": {"n": 1}}, upsert=True, session=session
                    )
            except PyMongoError:
                return  # the engine was killed: the parent takes over
            acks.write(f"{n}\n")
            n += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
