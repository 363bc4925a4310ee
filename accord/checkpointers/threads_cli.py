"""``accord threads rollback THREAD --to CHECKPOINT`` and ``accord threads gc-artifacts``:
the checkpointer's compensation and artifact commands (docs/durable-execution.md).

Registered on ``accord threads`` by :func:`accord.checkpointers.cli.register`; they act as
the operating-system user (the CLI's principal, role admin). Configuration:
``MONGODB_URI`` (else the embedded engine).
"""

from __future__ import annotations

from typing import Any

import typer

from accord.checkpointers.cli import DB, TENANT, console, out, threads_app
from accord.checkpointers.validation import MAX_ARTIFACT_GRACE
from accord.errors import AccordError
from accord.platform.cli_output import fail


def _saver(db: str) -> tuple[Any, Any]:
    """A client and an ``AccordSaver`` on ``db`` whose kernel acts as the OS user."""
    from accord import runtime
    from accord.checkpointers import AccordSaver
    from accord.platform import connect
    from accord.platform.context import Principal

    client = connect()
    uow = runtime.kernel(client, principal=Principal.os_user())
    return client, AccordSaver(client, db_name=db, uow=uow)


@threads_app.command("rollback")
def rollback(
    thread: str,
    to: str = typer.Option(..., "--to", help="The checkpoint id to rewind the thread to."),
    db: str = DB,
    tenant: str = TENANT,
) -> None:
    """Rewind THREAD to checkpoint --to and undo the business writes committed after it
    (from their before-images), in one transaction. Refused, naming the record, when
    another thread changed one of those records since; refused while a live run holds
    the thread."""
    client = None
    try:
        client, saver = _saver(db)
        done = saver.rollback({"configurable": {"thread_id": thread, "tenant_id": tenant}}, to=to)
    except AccordError as err:
        raise fail(console, err) from None
    finally:
        if client is not None:
            client.close()
    out.print(
        f"thread {thread!r} (tenant {tenant!r}) is back at checkpoint {done.checkpoint_id}: "
        f"{done.checkpoints_removed} later checkpoints removed, {done.records_restored} "
        f"business records restored ({done.writes_undone} writes undone)",
        markup=False,
    )


@threads_app.command("gc-artifacts")
def gc_artifacts(
    grace: float = typer.Option(
        3600.0,
        "--grace",
        min=0,
        max=MAX_ARTIFACT_GRACE,
        help="Seconds a pending artifact is kept (longer than any task).",
    ),
    db: str = DB,
) -> None:
    """Delete orphaned artifacts: pending ones (their step never committed) stored more
    than --grace seconds ago, of every tenant."""
    client = None
    try:
        client, saver = _saver(db)
        collected = saver.gc_artifacts(grace=grace)
    except AccordError as err:
        raise fail(console, err) from None
    finally:
        if client is not None:
            client.close()
    out.print(f"{collected} orphaned artifacts collected")
