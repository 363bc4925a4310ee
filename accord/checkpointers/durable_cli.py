"""``accord runs calls`` and ``accord runs resolve``: the recorded calls waiting for a human.

A recorded call with an intent and no result that is not declared idempotent parks its
run (docs/durable-execution.md). These commands list such calls and settle one with the
result it had, after a human checked with the provider; the next execution of its task
replays that result. They act as the operating-system user (the CLI's principal), through
the kernel like every write.
"""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

from accord.checkpointers import schema
from accord.errors import AccordError

runs_app = typer.Typer(help="Runs: recorded calls waiting for a human.", no_args_is_help=True)
out = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

DB = typer.Option("accord", "--db", help="Database of the checkpointer.")
TENANT = typer.Option(schema.DEFAULT_TENANT, "--tenant", help="Tenant of the threads.")


def _log(db: str) -> tuple[Any, Any]:
    """A client and the call log, acting as the OS user."""
    from accord import runtime
    from accord.platform import connect
    from accord.platform.context import Principal
    from accord.platform.synchronous.call_log import CallLog

    client = connect()
    uow = runtime.kernel(client, principal=Principal.os_user())
    return client, CallLog(uow, db, runs_collection=schema.CollectionNames().runs)


@runs_app.command("calls")
def list_calls(
    db: str = DB,
    tenant: str = TENANT,
    thread: str | None = typer.Option(None, "--thread", help="Only this thread's calls."),
    parked: bool = typer.Option(False, "--parked", help="Only calls parked for a human."),
) -> None:
    """The recorded calls whose effect is unknown (intent without result, raised, parked)."""
    try:
        client, log = _log(db)
        try:
            found = log.unsettled(tenant, thread_id=thread, parked_only=parked)
        finally:
            client.close()
    except AccordError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    if not found:
        out.print(f"no unsettled recorded calls (tenant {tenant!r})")
        return
    for doc in found:  # one line per call: whole keys, easy to copy and to grep
        error = f" error={doc['error']!r}" if doc.get("error") else ""
        out.print(
            f"{doc.get('thread_id')}  {doc.get('name')}  position={doc.get('position')}  "
            f"{doc.get('status')}  {doc.get('_id')}  since={doc.get('intent_at')}{error}",
            markup=False, highlight=False,
        )  # fmt: skip


@runs_app.command("resolve")
def resolve(
    thread: str,
    key: str,
    result: str = typer.Option(..., "--result", help="The call's result, as JSON."),
    db: str = DB,
    tenant: str = TENANT,
) -> None:
    """Settle the recorded call KEY of THREAD with the result it had (JSON): its task
    replays it. (Stored with LangGraph's default serializer; an application with another
    one settles calls with ``accord.checkpointers.recorded.resolve_call``.)"""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from accord.platform.context import Principal

    try:
        value = json.loads(result)
    except json.JSONDecodeError as exc:
        err_console.print(f"[red]--result is not JSON ({exc}); nothing was written[/red]")
        raise typer.Exit(2) from None
    kind, data = JsonPlusSerializer().dumps_typed(value)
    try:
        client, log = _log(db)
        try:
            log.setup()
            log.resolve(tenant, thread, key, {"type": kind, "data": data},
                        by=Principal.os_user().name)  # fmt: skip
        finally:
            client.close()
    except AccordError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    out.print(f"settled call {key} of thread {thread!r}; its task replays the result")


def register(app: typer.Typer) -> None:
    """Entry point (``accord.cli``): add ``accord runs`` to the ``accord`` app."""
    app.add_typer(runs_app, name="runs")
