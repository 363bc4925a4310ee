"""The checkpointer's commands of the ``accord`` CLI: ``accord checkpoints ...`` and
``accord threads ...``.

They register on the platform's typer app through the ``accord.cli`` entry point
(pyproject.toml).

* ``accord checkpoints migrate`` copies a database's MongoDBSaver threads into accord
  (:mod:`accord.checkpointers.asynchronous.migration`, run by its sync twin): resumable,
  idempotent, with a progress bar.
* ``accord threads delete THREAD``: delete a thread whole (refused under a legal hold).
* ``accord threads rollback THREAD --to CHECKPOINT`` and ``accord threads gc-artifacts``:
  :mod:`accord.checkpointers.threads_cli`.
* ``accord threads show|release THREAD``: who holds a thread, and taking it over. A run
  holds its thread with a lease (docs/checkpointer.md, "Ownership"). A process that died
  on this machine is noticed by the next claimer at once; one that died on another
  machine holds the thread until its lease expires (10 s by default). ``release`` ends
  whatever run holds the thread now, fenced: that run's next commit is refused, and the
  next invocation takes the thread at once.

Configuration: ``MONGODB_URI`` (else the embedded engine).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from accord.checkpointers import schema, validation
from accord.errors import AccordError, InvalidInputError
from accord.platform.artifacts import RUN
from accord.platform.cli_output import SafeConsole, database_name, fail, server_uri

if TYPE_CHECKING:
    from accord.platform.synchronous.leases import RunLeases

checkpoints_app = typer.Typer(
    help="The LangGraph checkpointer: migrate threads from MongoDBSaver.", no_args_is_help=True
)
console = SafeConsole(stderr=True, soft_wrap=True)  # errors and progress; lines never cut
out = SafeConsole(soft_wrap=True)  # results

URI = typer.Option(None, "--uri", help="MongoDB URI (default: MONGODB_URI, else the engine).")
DBPATH = typer.Option(
    None, "--dbpath", help="Data directory of the embedded engine (default .accord/data)."
)
THREADS = typer.Option(
    None,
    "--thread",
    help="Only this thread (repeatable); the database is then not recorded as migrated.",
)


def not_accords(value: str) -> str:
    """``migrate``'s --checkpoints/--writes check, the library's
    (:func:`~accord.checkpointers.validation.foreign_collection`) at the command line."""
    try:
        return validation.foreign_collection(value, "the collection")
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc)) from None


def runs_collection_name(value: str) -> str:
    """``--runs-collection``'s check: a run registry, never another of accord's collections
    (``threads release --runs-collection accord_policies`` wrote a lease document into the
    policies)."""
    problem = validation.collection_problem(value)
    if problem:
        raise typer.BadParameter(f"{value!r} is not a collection name: it {problem}")
    owner = validation.accords_class_of(value)
    if owner is not None and owner != RUN.name:
        raise typer.BadParameter(
            f"{value!r} is accord's own {owner!r} collection, not a run registry; nothing "
            f"was read or written. Name the registry (default {RUN.default_collection!r})"
        )
    return value


def _registry_in_catalog(uow: Any, db: str, collection: str) -> None:
    """Refuse ``collection`` when the database's catalog gives it to another class than the
    run registry (an application may name accord's collections as it likes)."""
    from accord.platform.artifacts import CATALOG, CATALOG_COLLECTION
    from accord.platform.context import ReadContext

    entry = uow.find_one(ReadContext("*", operation="threads.registry"), CATALOG.name, db,
                         CATALOG_COLLECTION, {"_id": collection})  # fmt: skip
    owner = entry.get("artifact") if entry else None
    if owner is not None and owner != RUN.name:
        raise InvalidInputError(
            f"{db}.{collection} is accord's own {owner!r} collection (its catalog says so), "
            f"not a run registry; nothing was read or written. Name the registry "
            f"(--runs-collection, default {RUN.default_collection!r})"
        )


@checkpoints_app.command("migrate")
def migrate(
    db: str = typer.Option(
        "checkpointing_db",
        "--db",
        help="MongoDBSaver's database (its default).",
        callback=database_name,
    ),
    to_db: str | None = typer.Option(
        None,
        "--to-db",
        help="accord's database (default: the same as --db).",
        callback=database_name,
    ),
    tenant: str = typer.Option("default", "--tenant", help="Tenant of the migrated threads."),
    checkpoints: str = typer.Option(
        "checkpoints",
        "--checkpoints",
        help="MongoDBSaver's checkpoint collection.",
        callback=not_accords,
    ),
    writes: str = typer.Option(
        "checkpoint_writes",
        "--writes",
        help="MongoDBSaver's pending-writes collection.",
        callback=not_accords,
    ),
    thread: list[str] | None = THREADS,
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
) -> None:
    """Copy MongoDBSaver's threads into accord (MongoDBSaver's collections are only read).
    Re-running it skips the threads already in accord, so it resumes after a crash."""
    from pymongo import MongoClient

    from accord.checkpointers.migrate import MigrationProgress
    from accord.checkpointers.synchronous.migration import MongoDBSaverMigration
    from accord.platform import connection

    client: MongoClient[Any] | None = None
    try:
        # checked at once: an unreachable host or a bad URI is one line within seconds
        client = connection.connect(server_uri(uri, dbpath))
        migration = MongoDBSaverMigration(
            client, db, target_db=to_db, tenant_id=tenant, checkpoint_collection_name=checkpoints,
            writes_collection_name=writes, threads=thread or None,
        )  # fmt: skip
        console.print(
            f"migrating MongoDBSaver threads of {db}.{checkpoints} into accord "
            f"({migration.target_db}, tenant {tenant!r})",
            markup=False,
        )
        with Progress(
            TextColumn("[bold]threads"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console,
        ) as bar:  # fmt: skip
            task = bar.add_task("migrate", total=None, detail="")

            def shown(p: MigrationProgress) -> None:
                bar.update(
                    task, total=p.total, completed=p.done,
                    detail=f"{p.migrated} copied, {p.skipped} already there, "
                    f"{p.checkpoints} checkpoints",
                )  # fmt: skip

            report = migration.run(on_progress=shown)
    except AccordError as exc:
        raise fail(console, exc) from exc
    finally:
        if client is not None:
            client.close()
    out.print(
        f"{report.threads} threads: {report.migrated} migrated ({report.checkpoints} "
        f"checkpoints, {report.writes} pending writes), {report.skipped} already in accord."
    )
    if report.diverged:
        named = ", ".join(repr(t) for t in report.diverged[:10])
        more = f" and {len(report.diverged) - 10} more" if len(report.diverged) > 10 else ""
        out.print(
            f"{len(report.diverged)} thread(s) went on in accord after their migration and "
            f"MongoDBSaver wrote them again since: left as accord has them, MongoDBSaver's "
            f"new checkpoints not copied ({named}{more}). Stop MongoDBSaver writing them."
        )
    if report.separated:
        out.print(
            f"{report.separated} documents an earlier accord had written into MongoDBSaver's "
            f"collections were copied into accord's own ({report.target})."
        )
    if report.recorded and migration.target_db == db:
        out.print(
            f"{report.source} is recorded as migrated ({db}.accord_migrations): savers on "
            f"{db} set up from now on continue these threads."
        )
    elif report.recorded:
        out.print(
            f"{report.source} is recorded as migrated into {migration.target_db} "
            f"({db}.accord_migrations): savers on {migration.target_db} continue these "
            f"threads; a saver set up on {db} still refuses them (they are in "
            f"{migration.target_db})."
        )
    else:
        out.print("Only the threads named were migrated; the database is not recorded as migrated.")


threads_app = typer.Typer(
    help="Inspect and take over threads held by runs (leases).", no_args_is_help=True
)

DB = typer.Option("accord", "--db", help="Database of the checkpointer.", callback=database_name)
TENANT = typer.Option(schema.DEFAULT_TENANT, "--tenant", help="Tenant of the thread.")
RUNS = typer.Option(
    schema.CollectionNames().runs,
    "--runs-collection",
    help="The run registry's collection.",
    callback=runs_collection_name,
)


def _leases(db: str, runs_collection: str) -> tuple[Any, RunLeases]:
    """A client and the runs service, acting as the OS user (the CLI's principal)."""
    from accord import runtime
    from accord.platform import connect
    from accord.platform.context import Principal
    from accord.platform.synchronous.leases import RunLeases

    client = connect()
    uow = runtime.kernel(client, principal=Principal.os_user())
    try:
        _registry_in_catalog(uow, db, runs_collection)
    except AccordError:
        client.close()
        raise
    return client, RunLeases(uow, db, runs_collection)


def _checked_ids(thread: str, tenant: str) -> None:
    """Refuse a thread or tenant id the saver would refuse (exit 2; before, ``release ''``
    wrote a registry document for the empty thread)."""
    from accord.checkpointers.validation import identifier

    try:
        identifier(thread, "thread")
        identifier(tenant, "tenant")
    except AccordError as err:
        console.error(err)
        raise typer.Exit(2) from None


@threads_app.command("show")
def show(thread: str, db: str = DB, tenant: str = TENANT, runs: str = RUNS) -> None:
    """Who holds THREAD now."""
    _checked_ids(thread, tenant)
    try:
        client, leases = _leases(db, runs)
        holder = leases.holder(tenant, thread)
        client.close()
    except AccordError as err:
        raise fail(console, err) from None
    if holder.run_id is None:
        out.print(f"thread {thread!r} (tenant {tenant!r}) is held by no run", markup=False)
    else:
        out.print(
            f"thread {thread!r} (tenant {tenant!r}) is held by {holder.describe()}", markup=False
        )


@threads_app.command("release")
def release(thread: str, db: str = DB, tenant: str = TENANT, runs: str = RUNS) -> None:
    """End the run holding THREAD (fenced: its next commit is refused).

    The next run takes the thread at once. Use it when a worker is gone and its lease
    has not expired yet.
    """
    _checked_ids(thread, tenant)
    try:
        client, leases = _leases(db, runs)
        before = leases.take_over(tenant, thread)
        client.close()
    except AccordError as err:
        raise fail(console, err) from None
    if before.run_id is None:
        out.print(
            f"thread {thread!r} (tenant {tenant!r}) was held by no run; it is free, and its "
            f"fence moved on",
            markup=False,
        )
    else:
        out.print(
            f"released thread {thread!r} (tenant {tenant!r}) from {before.describe()}; that "
            f"run's next commit will be refused",
            markup=False,
        )


@threads_app.command("delete")
def delete(
    thread: str,
    db: str = DB,
    tenant: str = TENANT,
    keep_memories: bool = typer.Option(
        False, "--keep-memories", help="Keep the long-term memories derived from the thread."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete THREAD whole: checkpoints, pending writes, values, messages, recorded calls
    (and, unless --keep-memories, the long-term memories derived only from it, as the
    aggregator catches up). A thread under a legal hold is refused (nothing is deleted);
    a run working on the thread loses it."""
    from accord import runtime
    from accord.checkpointers import AccordSaver
    from accord.errors import LegalHoldError
    from accord.platform import connect
    from accord.platform.context import Principal

    _checked_ids(thread, tenant)
    if not yes and not typer.confirm(
        f"Delete thread {thread!r} of tenant {tenant!r} in {db} (this cannot be undone)?"
    ):
        console.print("nothing deleted")
        raise typer.Exit(1)
    try:
        client = connect()
        uow = runtime.kernel(client, principal=Principal.os_user())
        saver = AccordSaver(client, db_name=db, uow=uow)
        saver.delete_thread(thread, tenant_id=tenant, keep_memories=keep_memories)
        client.close()
    except LegalHoldError as err:
        console.error(err, prefix="refused: ")
        raise typer.Exit(1) from None
    except AccordError as err:
        raise fail(console, err) from None
    kept = "; its long-term memories are kept" if keep_memories else ""
    out.print(f"deleted thread {thread!r} (tenant {tenant!r}) in {db}{kept}", markup=False)


def register(app: typer.Typer) -> None:
    """Entry point (``accord.cli``): add the checkpointer's commands to the ``accord`` app."""
    from accord.checkpointers import threads_cli  # noqa: F401  (registers its commands)

    app.add_typer(checkpoints_app, name="checkpoints")
    app.add_typer(threads_app, name="threads")
