"""The memory commands of the ``accord`` CLI: ``accord memory ...``, ``accord serve``,
``accord mcp``.

They register themselves on the platform's typer app through the ``accord.cli`` entry
point (pyproject.toml), so the platform names none of its parts. Heavy imports (the
aggregator, FastAPI, uvicorn, mcp) happen inside the commands, so ``accord --help`` stays
fast.

Configuration: ``MONGODB_URI`` (else the embedded engine for ``--dbpath``),
``ACCORD_DATABASE``, ``ACCORD_EMBEDDER`` (``hashing`` | ``voyage:<model>`` | a LangChain
provider string), ``ACCORD_EMBEDDING_DIMS``; API keys for ``serve`` from
``ACCORD_API_KEYS_FILE`` / ``ACCORD_API_KEYS``; the tenant of ``mcp`` from ``--tenant`` or
``ACCORD_MCP_TENANT``. Every process that touches one database must use the same embedder
and dimensions (a mismatch is refused with an error naming both).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import typer
from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict
from rich.table import Table

from accord.errors import AccordError, ConfigurationError
from accord.platform.cli_output import (
    SafeConsole,
    database_name,
    fail,
    print_whole,
    server_uri,
    text,
    whole,
)
from accord.platform.settings import EnvironmentSettings

memory_app = typer.Typer(
    help="Long-term memory: the aggregator worker, its outbox, API keys.",
    no_args_is_help=True,
    rich_markup_mode=None,  # as the platform's app: flags shown as flags
)
console = SafeConsole(stderr=True, soft_wrap=True)
out = SafeConsole(soft_wrap=True)


class MemorySettings(EnvironmentSettings):
    """Memory configuration from the environment (``ACCORD_*``)."""

    model_config = SettingsConfigDict(env_prefix="ACCORD_", extra="ignore")

    embedder: str | None = Field(default=None, description="hashing | voyage:<model> | ...")
    embedding_dims: int | None = Field(default=None, gt=0, le=8192)
    mcp_tenant: str | None = None


URI = typer.Option(None, "--uri", help="MongoDB URI (default: MONGODB_URI, else the engine).")
DBPATH = typer.Option(
    None, "--dbpath", help="Data directory of the embedded engine (default .accord/data)."
)
DB = typer.Option(
    None, "--db", help="Database (default: ACCORD_DATABASE or 'accord').", callback=database_name
)
EVENT_IDS = typer.Argument(None, help="Dead events to retry.", callback=text)
KEYS_FILE = typer.Option(
    None, "--keys-file", help="API keys (default: ACCORD_API_KEYS_FILE / ACCORD_API_KEYS)."
)

ADD_TO_KEYS_FILE = typer.Option(
    None,
    "--keys-file",
    help="Add the key's entry to this keys file (created if missing; TOML, or JSON for "
    ".json). A running 'accord serve' on that file picks it up without a restart.",
)


def _connect(uri: str | None, dbpath: Path | None, db: str | None) -> tuple[str, str]:
    from accord.platform import connection
    from accord.platform.settings import Settings

    return connection.resolve_uri(server_uri(uri, dbpath)), db or Settings().database


def _fail(exc: Exception) -> typer.Exit:
    """One line on stderr; exit 2 for a bad flag or setting, else 1 (before 2026-12-07,
    2 for every error: an unreachable server too)."""
    return fail(console, exc, message=_one_line(exc))


def _one_line(exc: Exception) -> str:
    """``exc`` as one line: pydantic's are four per problem, with a web address."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or exc.title}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
    return str(exc)


def extractor_from(spec: str) -> Any:
    """``rules`` (default) or ``llm:<provider:model>`` (LangChain's ``init_chat_model``)."""
    from accord.memory.extraction import RuleExtractor

    if spec == "rules":
        return RuleExtractor()
    if spec.startswith("llm:"):
        from accord.memory.llm_extractor import LLMExtractor

        try:
            from langchain.chat_models import init_chat_model  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ConfigurationError(
                "--extractor llm:... needs the langchain package and the provider's "
                "integration (e.g. pip install langchain langchain-openai)"
            ) from exc
        try:
            model = init_chat_model(spec[4:])
        except Exception as exc:  # the provider's package or API key is missing, a typo
            raise ConfigurationError(
                f"--extractor {spec}: LangChain could not build the model "
                f"({type(exc).__name__}: {exc}); install the provider's integration "
                f"(e.g. pip install langchain-openai) and set its API key"
            ) from exc
        return LLMExtractor(model)
    raise ConfigurationError(f"--extractor is 'rules' or 'llm:<provider:model>', not {spec!r}")


def _root(uri: str | None, dbpath: Path | None, db: str | None) -> tuple[Any, str]:
    """accord's root for a command, acting as the OS user who runs it (the aggregator it
    builds acts as the aggregator), and the database."""
    from accord.platform.context import Principal
    from accord.runtime import Accord

    settings = MemorySettings()
    resolved, database = _connect(uri, dbpath, db)
    app = Accord(resolved, db_name=database, embedder=settings.embedder,
                 dims=settings.embedding_dims, principal=Principal.os_user())  # fmt: skip
    return app, database


@memory_app.command("worker")
def worker(
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    db: str | None = DB,
    extractor: str = typer.Option("rules", help="rules | llm:<provider:model>", callback=text),
    lease: float = typer.Option(60.0, min=0.1, help="Seconds an event stays claimed."),
    max_attempts: int = typer.Option(5, min=1, help="Claims before an event is dead."),
    threshold: float = typer.Option(0.85, min=0.01, max=1.0, help="Merge similarity."),
    poll: float = typer.Option(0.1, min=0.0, help="Seconds to wait when idle."),
    drain: bool = typer.Option(False, "--drain", help="Exit when no event is available."),
    max_events: int | None = typer.Option(None, min=1, help="Exit after this many events."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Log every event."),
) -> None:
    """Aggregate outbox events into long-term memory until stopped (SIGTERM/Ctrl-C finish
    the current event first). Several workers may run at once."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from accord.memory.aggregator import AggregatorConfig, Outcome

    try:
        app, database = _root(uri, dbpath, db)
        config = AggregatorConfig(
            db_name=database, lease=lease, max_attempts=max_attempts, threshold=threshold,
            poll_interval=poll,
        )  # fmt: skip
        agg = app.aggregator(config, extractor=extractor_from(extractor))
    except AccordError as exc:
        raise _fail(exc) from exc
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    counts: dict[str, int] = {}

    def seen(outcome: Outcome) -> None:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
        if verbose:
            console.print(
                f"{outcome.event_id} {outcome.status} {outcome.memories} {outcome.error or ''}"
            )

    console.print(f"accord memory worker {agg.worker_id} on {database} ({agg.extractor.name})")
    agg.run(stop, max_events=max_events, until_idle=drain, on_outcome=seen)
    console.print(f"worker {agg.worker_id} stopped: {json.dumps(counts, sort_keys=True)}")
    app.close()


@memory_app.command("status")
def status(
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    db: str | None = DB,
    tenant: str | None = typer.Option(None, help="Only this tenant's events.", callback=text),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Backlog (pending, claimed, dead) and lag (step commit -> memories committed)."""
    from accord.memory.aggregator import AggregatorConfig, aggregation_stats

    try:
        app, database = _root(uri, dbpath, db)
        config = AggregatorConfig(db_name=database)
        stats = aggregation_stats(app.uow, database, config.outbox, tenant_id=tenant,
                                  kinds=config.kinds)  # fmt: skip
        app.close()
    except AccordError as exc:
        raise _fail(exc) from exc
    if as_json:
        out.print_json(json.dumps(stats.as_dict()))
        return
    table = Table("backlog", "pending", "claimed", "dead", "oldest pending", "lag p50", "lag p95",
                  "samples")  # fmt: skip

    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}s"

    table.add_row(str(stats.backlog), str(stats.pending), str(stats.claimed), str(stats.dead),
                  sec(stats.oldest_pending_age), sec(stats.lag_p50), sec(stats.lag_p95),
                  str(stats.lag_samples))  # fmt: skip
    out.print(table)


@memory_app.command("dead")
def dead(
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    db: str | None = DB,
    limit: int = typer.Option(20, min=1, max=100_000),
) -> None:
    """List dead-lettered events with their last error."""
    from accord.platform.artifacts import OUTBOX
    from accord.platform.context import ReadContext

    try:
        app, database = _root(uri, dbpath, db)
        docs = app.uow.find(ReadContext("*", operation="outbox.dead"), OUTBOX.name, database,
                            "outbox", {"status": "dead"}, limit=limit)  # fmt: skip
        app.close()
    except AccordError as exc:
        raise _fail(exc) from exc
    table = Table(whole("id", [str(d["_id"]) for d in docs]), "kind", "tenant", "thread",
                  "attempts", "error")  # fmt: skip
    for d in docs:
        # (every cell a string: a dead-lettered event is often one whose fields are not)
        table.add_row(str(d["_id"]), str(d.get("kind", "")), str(d.get("tenant_id", "")),
                      str(d.get("thread_id", "")), str(d.get("attempts", "")),
                      str(d.get("error", ""))[:200])  # fmt: skip
    print_whole(out, table)  # values whole: commands take them back


@memory_app.command("requeue")
def requeue(
    event_ids: list[str] = EVENT_IDS,
    all_dead: bool = typer.Option(False, "--all-dead", help="Retry every dead event."),
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    db: str | None = DB,
) -> None:
    """Make dead events available again (attempts start over), e.g. after fixing the
    extractor or the model configuration."""
    from accord.memory.aggregator import requeue_plan

    if not event_ids and not all_dead:
        raise _fail(ConfigurationError("name the events to requeue, or pass --all-dead"))
    if event_ids and all_dead:  # (the ids were ignored: every dead event was requeued)
        raise _fail(
            ConfigurationError(
                "name the events to requeue or pass --all-dead, not both; nothing was requeued"
            )
        )
    try:
        app, database = _root(uri, dbpath, db)
        result = app.uow.execute(
            requeue_plan(database, "outbox", None if all_dead else list(event_ids))
        )
        app.close()
    except AccordError as exc:
        raise _fail(exc) from exc
    out.print(f"requeued {result['outbox:requeue'].modified} dead event(s)")


@memory_app.command("api-key")
def api_key(
    tenant: str = typer.Option(..., help="The tenant the key may read and write.", callback=text),
    name: str = typer.Option(
        ..., help="Who uses the key (shown in logs and audit).", callback=text
    ),
    read_only: bool = typer.Option(False, "--read-only", help="Only read."),
    keys_file: Path | None = ADD_TO_KEYS_FILE,
    expires_in_days: float | None = typer.Option(
        None,
        "--expires-in-days",
        min=0.001,
        max=36_500,
        help="Refuse the key from this many days on.",
    ),
) -> None:
    """Create an API key for 'accord serve'. Prints the key once (give it to the client);
    the keys file holds only its SHA-256. With --keys-file the entry is added to the
    file, else it is printed for you to add. A running server picks up the edited file
    within a second; no restart."""
    from datetime import UTC, datetime, timedelta

    from accord.memory import model
    from accord.memory.principals import ApiKeys, Principal, Scope, hash_key, new_key

    key = new_key()
    scopes: list[Scope] = ["read"] if read_only else ["read", "write"]
    try:
        model.check_tenant(tenant)
        expires_at = None
        if expires_in_days is not None:
            at = datetime.now(UTC) + timedelta(days=expires_in_days)
            expires_at = at.replace(microsecond=0)
        principal = Principal(
            name=name, tenant=tenant, key_sha256=hash_key(key), scopes=frozenset(scopes),
            expires_at=expires_at,
        )  # fmt: skip
        if keys_file is not None:
            ApiKeys.add_to_file(keys_file, principal)
    except (AccordError, ValueError) as exc:  # ValueError: pydantic's, for a bad name
        raise _fail(exc) from exc
    expiry = ""
    if expires_at is not None:
        expiry = f"\nexpires_at = {expires_at.isoformat().replace('+00:00', 'Z')}"
    console.print("API key (shown once; give it to the client):")
    out.print(key, highlight=False)
    if keys_file is not None:
        console.print(f"added {name!r} (tenant {tenant!r}) to {keys_file}", highlight=False)
        return
    console.print("Add to the keys file (ACCORD_API_KEYS_FILE), or pass --keys-file:")
    out.print(
        f'\n[[principals]]\nname = {json.dumps(name)}\ntenant = {json.dumps(tenant)}\n'
        f'key_sha256 = "{principal.key_sha256}"\nscopes = {json.dumps(scopes)}{expiry}',
        markup=False, highlight=False,
    )  # fmt: skip


def serve(
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    db: str | None = DB,
    host: str = typer.Option("127.0.0.1", help="Address to bind; 127.0.0.1 unless you mean it."),
    port: int = typer.Option(8000, min=0, max=65535),
    keys_file: Path | None = KEYS_FILE,
) -> None:
    """Serve the memory HTTP API (FastAPI on uvicorn; OpenAPI at /docs). Needs the
    server extra: pip install 'accord[server]'."""
    from accord.extras import require
    from accord.memory.embedders import resolve_embedder
    from accord.memory.principals import ApiKeys

    settings = MemorySettings()
    try:
        uvicorn = require("uvicorn", "accord serve")
        create_app = require("accord.memory.http_api", "accord serve").create_app
        keys = ApiKeys.from_file(keys_file) if keys_file else ApiKeys.from_env()
        # resolved here: a bad ACCORD_EMBEDDER is one line, not the server's traceback
        embedder = resolve_embedder(settings.embedder, settings.embedding_dims)
        resolved, database = _connect(uri, dbpath, db)
        app = create_app(resolved, keys=keys, db_name=database, embedder=embedder,
                         dims=settings.embedding_dims)  # fmt: skip
    except AccordError as exc:
        raise _fail(exc) from exc
    console.print(
        f"accord memory API on http://{host}:{port} ({len(keys)} API keys, db {database})"
    )
    uvicorn.run(app, host=host, port=port, log_level="info")


def mcp(
    tenant: str | None = typer.Option(
        None, help="The tenant (default: ACCORD_MCP_TENANT).", callback=text
    ),
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    db: str | None = DB,
) -> None:
    """Serve accord memory to an MCP client over stdio (tools: search_memory, save_memory,
    get_memory, delete_memory, list_namespaces). Needs the server extra:
    pip install 'accord[server]'."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # stdout is the protocol
    from accord.extras import require
    from accord.memory.embedders import resolve_embedder

    settings = MemorySettings()
    tenant = tenant or settings.mcp_tenant
    try:
        mcp_server = require("accord.memory.mcp_server", "accord mcp")
        anyio = require("anyio", "accord mcp")
        if not tenant:
            raise ConfigurationError("give the tenant: --tenant or ACCORD_MCP_TENANT")
        embedder = resolve_embedder(settings.embedder, settings.embedding_dims)
        resolved, database = _connect(uri, dbpath, db)
        server = mcp_server.create_server(resolved, tenant_id=tenant, db_name=database,
                               embedder=embedder, dims=settings.embedding_dims)  # fmt: skip
    except AccordError as exc:
        raise _fail(exc) from exc
    anyio.run(mcp_server.serve_stdio, server)


def register(app: typer.Typer) -> None:
    """Entry point (``accord.cli``): add the memory commands to the ``accord`` app."""
    app.add_typer(memory_app, name="memory")
    app.command("serve")(serve)
    app.command("mcp")(mcp)
