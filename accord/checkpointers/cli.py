"""``accord threads``: who holds a thread, and taking a thread over.

A run holds its thread with a lease (docs/checkpointer.md, "Ownership"). A process that
died on this machine is noticed by the next claimer at once; one that died on another
machine holds the thread until its lease expires (10 s by default). ``accord threads
release THREAD`` ends whatever run holds the thread now, fenced: that run's next commit
is refused, and the next invocation takes the thread at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from accord.checkpointers import schema
from accord.errors import AccordError

if TYPE_CHECKING:
    from accord.platform.synchronous.leases import RunLeases

threads_app = typer.Typer(
    help="Inspect and take over threads held by runs (leases).", no_args_is_help=True
)
console = Console()

DB = typer.Option("accord", "--db", help="Database of the checkpointer.")
TENANT = typer.Option(schema.DEFAULT_TENANT, "--tenant", help="Tenant of the thread.")
RUNS = typer.Option(
    schema.CollectionNames().runs, "--runs-collection", help="The run registry's collection."
)


def _leases(db: str, runs_collection: str) -> tuple[Any, RunLeases]:
    """A client and the runs service, acting as the OS user (the CLI's principal)."""
    from accord import runtime
    from accord.platform import connect
    from accord.platform.context import Principal
    from accord.platform.synchronous.leases import RunLeases

    client = connect()
    uow = runtime.kernel(client, principal=Principal.os_user())
    return client, RunLeases(uow, db, runs_collection)


@threads_app.command("show")
def show(thread: str, db: str = DB, tenant: str = TENANT, runs: str = RUNS) -> None:
    """Who holds THREAD now."""
    try:
        client, leases = _leases(db, runs)
        holder = leases.holder(tenant, thread)
        client.close()
    except AccordError as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(1) from None
    if holder.run_id is None:
        console.print(f"thread {thread!r} (tenant {tenant!r}) is held by no run")
    else:
        console.print(f"thread {thread!r} (tenant {tenant!r}) is held by {holder.describe()}")


@threads_app.command("release")
def release(thread: str, db: str = DB, tenant: str = TENANT, runs: str = RUNS) -> None:
    """End the run holding THREAD (fenced: its next commit is refused).

    The next run takes the thread at once. Use it when a worker is gone and its lease
    has not expired yet.
    """
    try:
        client, leases = _leases(db, runs)
        before = leases.take_over(tenant, thread)
        client.close()
    except AccordError as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(1) from None
    if before.run_id is None:
        console.print(
            f"thread {thread!r} (tenant {tenant!r}) was held by no run; it is free, and its "
            f"fence moved on"
        )
    else:
        console.print(
            f"released thread {thread!r} (tenant {tenant!r}) from {before.describe()}; that "
            f"run's next commit will be refused"
        )


def register(app: typer.Typer) -> None:
    """Entry point (``accord.cli``): add the thread commands to the ``accord`` app."""
    app.add_typer(threads_app, name="threads")
