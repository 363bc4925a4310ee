"""``make demo``: accord on the embedded engine, end to end.

It starts (or reuses) the embedded engine for ``./.accord/demo`` through
``accord.platform.connect()`` (or uses ``MONGODB_URI``), then shows:

1. the engine: a multi-document transaction commits, an aborted one leaves nothing behind,
   a second session cannot see uncommitted writes, two writers conflict;
2. the checkpointer (:mod:`accord.demo_agent`): a LangGraph agent whose worker is
   SIGKILLed mid-run resumes in a new process at the last committed step, with every
   business write and message exactly once;
3. long-term memory: the aggregator turns the outbox events of those step transactions
   into memories (the user's stated preference, with the thread and message it came
   from), found through the memory service and the LangGraph store.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure
from rich.console import Console
from rich.markup import escape

from accord import demo_agent
from accord.errors import AccordError
from accord.platform import connect, connection

# soft_wrap: lines are never cut at the terminal's (or a pipe's 80) columns.
console = Console(soft_wrap=True)


def show(db: Any) -> None:
    accounts = list(db.accounts.find({}, {"balance": 1}))
    console.print(f"  accounts: {accounts}  ledger entries: {db.ledger.count_documents({})}")


def run(data_dir: Path) -> None:
    try:
        client: MongoClient = connect(data_dir=data_dir)
    except AccordError as exc:  # e.g. MONGODB_URI names a server that does not answer
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise SystemExit(1) from None
    where = os.environ.get("MONGODB_URI") or f"embedded engine, data in {data_dir}"
    console.print(f"[bold]accord demo[/bold] on {where} (server {client.server_info()['version']})")
    db = client.accord_demo
    db.drop_collection("accounts")
    db.drop_collection("ledger")
    db.accounts.insert_many([{"_id": "alice", "balance": 100}, {"_id": "bob", "balance": 50}])
    console.print(f"accounts: {list(db.accounts.find({}, {'balance': 1}))}")

    def transfer(session, amount: int) -> None:  # type: ignore[no-untyped-def]
        db.accounts.update_one({"_id": "alice"}, {"$inc": {"balance": -amount}}, session=session)
        db.accounts.update_one({"_id": "bob"}, {"$inc": {"balance": amount}}, session=session)
        db.ledger.insert_one(
            {"from": "alice", "to": "bob", "amount": amount, "at": dt.datetime.now(dt.UTC)},
            session=session,
        )

    with client.start_session() as session:
        session.with_transaction(lambda s: transfer(s, 30))
    console.print(
        "[green]committed[/green] transfer of 30 in one transaction (2 updates + 1 insert):"
    )
    show(db)

    with client.start_session() as session:
        session.start_transaction()
        transfer(session, 1000)
        inside = db.accounts.find_one({"_id": "alice"}, session=session) or {}
        outside = db.accounts.find_one({"_id": "alice"}) or {}
        console.print(
            f"inside an open transaction alice has {inside['balance']}; another session still sees {outside['balance']}"
        )
        session.abort_transaction()
    console.print("[yellow]aborted[/yellow] the second transfer; nothing of it is visible:")
    show(db)

    s1, s2 = client.start_session(), client.start_session()
    s1.start_transaction()
    s2.start_transaction()
    db.accounts.update_one({"_id": "bob"}, {"$inc": {"balance": 1}}, session=s1)
    try:
        db.accounts.update_one({"_id": "bob"}, {"$inc": {"balance": 1}}, session=s2)
    except OperationFailure as exc:
        labels = ", ".join(sorted(exc.details.get("errorLabels", []))) if exc.details else ""
        console.print(
            f"two transactions writing bob at once: the second gets {exc.code} {exc.details.get('codeName') if exc.details else ''} [{labels}] and would retry"
        )
    s1.abort_transaction()
    s2.end_session()
    s1.end_session()
    total = sum(d["balance"] for d in db.accounts.find())
    console.print(f"total balance is still {total}.")
    uri = os.environ.get("MONGODB_URI") or connection.resolve_uri(data_dir=data_dir)
    client.close()
    demo_agent.main(uri, console)
    if not os.environ.get("MONGODB_URI"):
        console.print(
            "\nThe engine keeps running for other processes; stop it with "
            f"`.venv/bin/accord engine stop --dbpath {data_dir}`."
        )


if __name__ == "__main__":
    run(Path(os.environ.get("ACCORD_DATA_DIR", ".accord/demo")))
