"""``accord runs`` (the queue of runs and the recorded calls waiting for a human) and
``accord worker`` (executes queued runs).

``accord runs submit|ls|show|approve|reject|resume|cancel|fork`` act on the queue of runs
(:mod:`accord.platform.asynchronous.run_queue`); values (input, resume values) are JSON on
the command line, stored with LangGraph's default serializer as the worker reads them.

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

from accord.checkpointers import schema
from accord.errors import AccordError
from accord.platform.cli_output import SafeConsole, database_name, fail, text

runs_app = typer.Typer(
    help="Runs: the queue of runs (submit, ls, show, approve, reject, resume, cancel, fork) "
    "and recorded calls waiting for a human.",
    no_args_is_help=True,
)
out = SafeConsole(soft_wrap=True)
err_console = SafeConsole(stderr=True, soft_wrap=True)

DB = typer.Option("accord", "--db", help="Database of the checkpointer.", callback=database_name)
TENANT = typer.Option(
    schema.DEFAULT_TENANT, "--tenant", help="Tenant of the threads.", callback=text
)
#: A run id argument (every text value is checked: ``text``).
RUN_ID = typer.Argument(..., callback=text)


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
    thread: str | None = typer.Option(
        None, "--thread", help="Only this thread's calls.", callback=text
    ),
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
        raise fail(err_console, exc) from None
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
    thread: str = typer.Argument(..., callback=text),
    key: str = typer.Argument(..., callback=text),
    result: str = typer.Option(..., "--result", help="The call's result, as JSON.", callback=text),
    db: str = DB,
    tenant: str = TENANT,
) -> None:
    """Settle the recorded call KEY of THREAD with the result it had (JSON): its task
    replays it. (Stored with LangGraph's default serializer; an application with another
    one settles calls with ``accord.checkpointers.recorded.resolve_call``.)"""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from accord.platform.context import Principal

    value = _json(result, "--result")
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
        raise fail(err_console, exc) from None
    out.print(f"settled call {key} of thread {thread!r}; its task replays the result")


# --- the queue of runs -------------------------------------------------------------------


def _queue(db: str) -> tuple[Any, Any]:
    """A client and the queue of runs, acting as the OS user."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from accord import runtime
    from accord.platform import connect
    from accord.platform.context import Principal
    from accord.platform.synchronous.run_queue import RunQueue

    client = connect()
    uow = runtime.kernel(client, principal=Principal.os_user())
    return client, RunQueue(uow, db, codec=JsonPlusSerializer())


def _json(value: str | None, option: str) -> Any:
    """``value`` parsed as JSON, else exit 2 naming ``option``."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
        # a "\ud800" escape decodes to a lone surrogate, which no store encodes
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except json.JSONDecodeError as exc:
        problem = f"is not JSON ({exc})"
    except UnicodeEncodeError:
        problem = 'holds a lone surrogate (such as "\\ud800"): strings must be valid Unicode'
    else:
        return parsed
    err_console.error(f"{option} {problem}; nothing was written", prefix="")
    raise typer.Exit(2)


def _on_queue(db: str, action: Any) -> Any:
    """Run ``action(queue)``; an accord error is printed and exits (``fail``: 2 for a
    bad flag or setting, else 1)."""
    try:
        client, queue = _queue(db)
        try:
            return action(queue)
        finally:
            client.close()
    except AccordError as exc:
        raise fail(err_console, exc) from None


CREDENTIAL = typer.Option(
    None, "--credential",
    help="NAME=EXPIRY (ISO 8601 with a timezone): a token the run holds and when it expires.",
    callback=text,
)  # fmt: skip


def _credentials(values: list[str] | None) -> dict[str, Any] | None:
    from datetime import datetime

    if not values:
        return None
    parsed: dict[str, Any] = {}
    for value in values:
        name, sep, when = value.partition("=")
        try:
            if not sep:
                raise ValueError("no '='")
            parsed[name] = datetime.fromisoformat(when)
        except ValueError as exc:
            err_console.error(f"--credential {value!r}: expected NAME=ISO-8601 ({exc}); "
                              f"nothing was written", prefix="")  # fmt: skip
            raise typer.Exit(2) from None
    return parsed


def _line(run: Any) -> str:
    owner = f"  owner={run.owner}" if run.status == "running" and run.owner else ""
    return (
        f"{run.run_id}  {run.status}  thread={run.thread_id}  graph={run.graph}  "
        f"priority={run.priority}  attempts={run.attempts}{owner}  submitted={run.submitted_at}"
    )


@runs_app.command("submit")
def submit(
    graph: str = typer.Argument(
        ..., help="The graph, as module:attribute (what the worker runs).", callback=text
    ),
    input: str | None = typer.Option(
        None, "--input", help="The run's input, as JSON.", callback=text
    ),
    thread: str | None = typer.Option(
        None, "--thread", help="Thread (default: a new one).", callback=text
    ),
    priority: int = typer.Option(0, "--priority", help="Higher runs first."),
    key: str | None = typer.Option(
        None, "--key", help="Idempotency key: submitted once.", callback=text
    ),
    wait_timeout: float | None = typer.Option(
        None, "--wait-timeout", help="Seconds a wait in interrupt() may last."
    ),
    on_timeout: str = typer.Option(
        "fail", "--on-timeout", help="fail, cancel or resume.", callback=text
    ),
    timeout_value: str | None = typer.Option(
        None, "--timeout-value", help="JSON value a resume on timeout gives.", callback=text
    ),
    credential: list[str] | None = CREDENTIAL,
    db: str = DB,
    tenant: str = TENANT,
) -> None:
    """Queue a run of GRAPH; prints its run id (alone on stdout: R=$(accord runs submit
    ...) works; its status and thread go to stderr)."""
    value = _json(input, "--input")
    fallback = _json(timeout_value, "--timeout-value")
    held = _credentials(credential)
    run = _on_queue(db, lambda q: q.submit(
        graph, value, tenant_id=tenant, thread_id=thread, priority=priority,
        idempotency_key=key, wait_timeout=wait_timeout, on_timeout=on_timeout,
        timeout_value=fallback, credentials=held,
    ))  # fmt: skip
    out.print(run.run_id, markup=False, highlight=False)
    err_console.print(f"{run.status}  thread={run.thread_id}", markup=False, highlight=False)


@runs_app.command("ls")
def list_runs(
    status: str | None = typer.Option(
        None, "--status", help="Only runs with this status.", callback=text
    ),
    thread: str | None = typer.Option(
        None, "--thread", help="Only this thread's runs.", callback=text
    ),
    limit: int = typer.Option(100, "--limit", help="At most this many, newest first."),
    db: str = DB,
    tenant: str = TENANT,
) -> None:
    """The runs of the tenant, newest first."""
    found = _on_queue(db, lambda q: q.list(tenant_id=tenant, status=status, thread_id=thread,
                                           limit=limit))  # fmt: skip
    if not found:
        out.print(f"no runs (tenant {tenant!r})")
        return
    for run in found:
        out.print(_line(run), markup=False, highlight=False)


@runs_app.command("show")
def show(run_id: str = RUN_ID, db: str = DB, tenant: str = TENANT) -> None:
    """One run: status, owner, lease, what it waits for, its events, its result or error."""
    from bson import json_util

    def read(q: Any) -> tuple[Any, Any]:
        run = q.get(run_id, tenant_id=tenant)
        result = q.result(run_id, tenant_id=tenant) if run.status == "done" else None
        return run, result

    run, result = _on_queue(db, read)
    out.print(_line(run), markup=False, highlight=False)
    if run.lease_expires is not None:
        out.print(f"lease until {run.lease_expires}  fence={run.fence}", markup=False)
    if run.status == "waiting" and run.wait:
        shown = {k: v for k, v in run.wait.items() if k != "checkpoint_id"}
        out.print("waiting: " + json_util.dumps(shown), markup=False, highlight=False)
    for name, expires in sorted((run.document.get("credentials") or {}).items()):
        out.print(f"credential {name} expires {expires}", markup=False, highlight=False)
    if run.error:
        out.print(f"error: {run.error}", markup=False, highlight=False)
    if result is not None:
        out.print("result: " + json.dumps(result, default=repr), markup=False, highlight=False)
    for event in run.events:
        details = {k: v for k, v in event.items() if k not in ("event", "at")}
        extra = f"  {json.dumps(details, default=str)}" if details else ""
        out.print(f"  {event.get('at')}  {event.get('event')}{extra}", markup=False,
                  highlight=False)  # fmt: skip


def _decide(run_id: str, value: str | None, db: str, tenant: str, decision: str) -> None:
    from accord.platform.context import Principal

    by = Principal.os_user().name
    parsed = _json(value, "--value")
    if decision == "approved":
        v = True if value is None else parsed
        _on_queue(db, lambda q: q.approve(run_id, v, tenant_id=tenant, by=by))
    elif decision == "rejected":
        v = False if value is None else parsed
        _on_queue(db, lambda q: q.reject(run_id, v, tenant_id=tenant, by=by))
    else:
        _on_queue(db, lambda q: q.resume(run_id, parsed, tenant_id=tenant, by=by))
    out.print(f"run {run_id} {decision} by {by}; queued for a worker", markup=False)


VALUE = typer.Option(None, "--value", help="The value interrupt() returns, as JSON.", callback=text)


@runs_app.command("approve")
def approve(
    run_id: str = RUN_ID, value: str | None = VALUE, db: str = DB, tenant: str = TENANT
) -> None:
    """Approve a waiting run: resumed with --value (default true)."""
    _decide(run_id, value, db, tenant, "approved")


@runs_app.command("reject")
def reject(
    run_id: str = RUN_ID, value: str | None = VALUE, db: str = DB, tenant: str = TENANT
) -> None:
    """Reject a waiting run: resumed with --value (default false)."""
    _decide(run_id, value, db, tenant, "rejected")


@runs_app.command("resume")
def resume(
    run_id: str = RUN_ID, value: str | None = VALUE, db: str = DB, tenant: str = TENANT
) -> None:
    """Resume a waiting run with Command(resume=--value)."""
    _decide(run_id, value, db, tenant, "resumed")


@runs_app.command("refresh")
def refresh(
    run_id: str = RUN_ID,
    credential: list[str] | None = CREDENTIAL,
    db: str = DB,
    tenant: str = TENANT,
) -> None:
    """Record new expiries of a run's credentials (refreshed tokens)."""
    from accord.platform.context import Principal

    fresh = _credentials(credential)
    if not fresh:
        err_console.print("[red]give at least one --credential NAME=EXPIRY[/red]")
        raise typer.Exit(2)
    by = Principal.os_user().name
    _on_queue(db, lambda q: q.refresh_credentials(run_id, fresh, tenant_id=tenant, by=by))
    out.print(f"run {run_id}: credentials {', '.join(sorted(fresh))} refreshed", markup=False)


@runs_app.command("cancel")
def cancel(run_id: str = RUN_ID, db: str = DB, tenant: str = TENANT) -> None:
    """Cancel a run (a running one stops at its next step)."""
    from accord.platform.context import Principal

    by = Principal.os_user().name
    run = _on_queue(db, lambda q: q.cancel(run_id, tenant_id=tenant, by=by))
    what = "cancel requested (it stops at its next step)" if run.status == "running" else run.status
    out.print(f"run {run_id}: {what}", markup=False)


@runs_app.command("fork")
def fork(
    run_id: str = RUN_ID,
    checkpoint: str | None = typer.Option(
        None, "--checkpoint", help="Default: the latest.", callback=text
    ),
    thread: str | None = typer.Option(None, "--thread", help="The new thread's id.", callback=text),
    db: str = DB,
    tenant: str = TENANT,
) -> None:
    """A new run on a new thread continuing RUN_ID's thread from a checkpoint."""
    run = _on_queue(db, lambda q: q.fork(run_id, tenant_id=tenant, checkpoint_id=checkpoint,
                                         thread_id=thread))  # fmt: skip
    out.print(f"{run.run_id}  {run.status}  thread={run.thread_id}", markup=False)


def worker_command(
    graph: str = typer.Option(
        ..., "--graph", help="The graph to serve, as module:attribute.", callback=text
    ),
    concurrency: int = typer.Option(4, "--concurrency", help="Runs executed at once."),
    tenant_limit: int | None = typer.Option(
        None,
        "--tenant-limit",
        help="Runs of one tenant executed at once by all workers together (give each the same).",
    ),
    poll: float = typer.Option(0.5, "--poll", help="Seconds between looks at the queue."),
    grace: float = typer.Option(
        30.0, "--grace", help="Seconds SIGTERM lets runs finish before giving them back."
    ),
    lease: float = typer.Option(10.0, "--lease", help="Lease of a claimed run, in seconds."),
    max_attempts: int = typer.Option(
        5, "--max-attempts", help="Claims of one run without an end before it is failed."
    ),
    db: str = DB,
    until_idle: bool = typer.Option(
        False, "--until-idle", help="Exit when nothing is left to run (for batch jobs)."
    ),
    use_async: bool = typer.Option(
        False, "--async", help="Run on asyncio (AsyncWorker): for graphs with async nodes."
    ),
) -> None:
    """Claim queued runs of GRAPH and execute them through the accord checkpointer, until
    SIGTERM (docs/durable-execution.md, "The queue of runs and workers")."""
    import logging
    import sys

    from accord.checkpointers.worker import serve

    sys.path.insert(0, "")  # --graph names modules of the current directory too
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        if use_async:
            import asyncio

            from accord.checkpointers.async_worker import serve_async

            executed = asyncio.run(serve_async(
                graph, db=db, concurrency=concurrency, tenant_limit=tenant_limit, poll=poll,
                grace=grace, lease=lease, until_idle=until_idle, max_attempts=max_attempts,
            ))  # fmt: skip
        else:
            executed = serve(graph, db=db, concurrency=concurrency, tenant_limit=tenant_limit,
                             poll=poll, grace=grace, lease=lease, until_idle=until_idle,
                             max_attempts=max_attempts)  # fmt: skip
    except AccordError as exc:
        raise fail(err_console, exc) from None
    err_console.print(f"accord worker: executed {executed} run(s); exiting")


def register(app: typer.Typer) -> None:
    """Entry point (``accord.cli``): add ``accord runs`` and ``accord worker`` to the
    ``accord`` app."""
    app.add_typer(runs_app, name="runs")
    app.command("worker")(worker_command)
