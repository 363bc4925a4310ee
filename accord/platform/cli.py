"""The ``accord`` command line.

Help is rendered in click's plain style (``rich_markup_mode=None``): typer's rich panels
show every flag, ``--help`` included, as taking a ``<bool>`` value.
"""

from __future__ import annotations

import logging
import math
import unicodedata
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import typer

from accord.errors import AccordError
from accord.platform import connection
from accord.platform.cli_output import USAGE, SafeConsole, fail, is_usage_error
from accord.platform.embedded.discovery import DEFAULT_PORT
from accord.platform.logs import describe
from accord.platform.settings import Settings

logger = logging.getLogger("accord.cli")


class _App(typer.Typer):
    """The ``accord`` app: an exception no command turned into a message is one line on
    stderr and exit 1 (2 for a usage error: a bad setting or flag), its traceback at
    DEBUG (``accord --debug``). Before, rich printed a traceback of 40 lines
    (``MONGODB_URI=mongodb://h:99999 accord runs ls``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:  # SystemExit (click's exits, typer.Exit) passes
            if is_usage_error(exc):  # a bad setting read where no command expected it
                err_console.error(exc)
                raise SystemExit(USAGE) from None
            err_console.error(
                f"{describe(exc)} (accord did not expect this; what the command did before "
                f"it is not known: check before retrying; `accord --debug ...` shows the "
                f"traceback)"
            )
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("traceback of the failed command", exc_info=exc)
            raise SystemExit(1) from None


app = _App(
    help="accord: transactional state and memory for LangGraph agents on MongoDB.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
engine_app = typer.Typer(
    help="Run the embedded MongoDB-compatible engine.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(engine_app, name="engine")
console = SafeConsole(soft_wrap=True)  # lines a script may parse are never cut
err_console = SafeConsole(stderr=True, soft_wrap=True)  # errors: stderr, as the engine's own


def _version(value: bool) -> None:
    if value:
        try:
            found = version("accord")
        except PackageNotFoundError:  # run from a source tree that was never installed
            found = "unknown (not installed)"
        console.print(f"accord {found}", highlight=False)
        raise typer.Exit()


@app.callback()
def main(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Log accord's DEBUG lines on stderr, tracebacks included."
    ),
) -> None:
    """accord: transactional state and memory for LangGraph agents on MongoDB."""
    if debug:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("accord").setLevel(logging.DEBUG)


def _control_at(text: str) -> int | None:
    """Where ``text`` holds its first control character (newline, tab, escape ...)."""
    return next((i for i, c in enumerate(text) if unicodedata.category(c) == "Cc"), None)


def _dbpath(value: Path) -> Path:
    # (before 2026-12-07 a path holding a newline or an escape was printed without it:
    # the path shown, and the `accord engine stop --dbpath ...` line, were another one)
    text = str(value)
    at = _control_at(text)
    if at is not None:
        raise typer.BadParameter(
            f"{text!r} holds a control character ({text[at]!r} at character {at}), which "
            f"no message could show as it is; choose a directory name without one"
        )
    return value


DBPATH = typer.Option(
    Path(".accord/data"), "--dbpath", callback=_dbpath, help="Data directory of the engine."
)


def _positive(value: float) -> float:
    # (NaN passed `value <= 0`: TTL passes that never ran; inf: transactions never aborted)
    if not math.isfinite(value) or value <= 0 or value > 86_400:
        raise typer.BadParameter(
            f"must be a number of seconds above 0 and at most a day, got {value}"
        )
    return value


def _window(value: float) -> float:
    # (inf passed `min=0`: every snapshot read at a cluster time then failed with the
    # engine's internal OverflowError; NaN was refused as "below 0")
    if not math.isfinite(value) or value < 0 or value > 86_400:
        raise typer.BadParameter(f"must be a number of seconds from 0 to a day, got {value}")
    return value


def _host(value: str) -> str:
    # ('' bound every interface, 0.0.0.0, and printed the URI 'mongodb://:PORT')
    if not value.strip() or value != value.strip():
        raise typer.BadParameter(
            f"{value!r} is no address; give a host name or IP (127.0.0.1 for this machine "
            f"only, 0.0.0.0 for every interface)"
        )
    return value


def _max_conns(value: int | None) -> int | None:
    # (no upper bound before 2026-12-07: past the open-file limit the cap never acted,
    # accept() failed with EMFILE and the engine could not open its own files)
    from accord.platform.embedded.server import check_max_connections

    if value is not None:
        try:
            check_max_connections(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


@engine_app.command("start")
def engine_start(
    dbpath: Path = DBPATH,
    port: int = typer.Option(
        DEFAULT_PORT,
        "--port",
        min=0,
        max=65535,
        help=f"TCP port (0: any free port). {DEFAULT_PORT} by default, not mongod's 27017, "
        "so that a local mongod and the engine never collide.",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", callback=_host, help="Address to bind; 127.0.0.1 unless you mean it."
    ),
    foreground: bool = typer.Option(
        False, "--foreground", help="Run in this terminal until Ctrl-C."
    ),
    no_sync: bool = typer.Option(False, "--no-sync", help="Skip fsync on commit (tests only)."),
    ttl_interval: float = typer.Option(
        60.0, "--ttl-interval", callback=_positive, help="Seconds between TTL passes."
    ),
    transaction_lifetime: float = typer.Option(
        60.0,
        "--transaction-lifetime",
        callback=_positive,
        help="Seconds after which an open transaction is aborted (mongod: 60).",
    ),
    snapshot_history_window: float = typer.Option(
        300.0,
        "--snapshot-history-window",
        callback=_window,
        help="Seconds of history kept for snapshot reads at a past cluster time "
        "(mongod's minSnapshotHistoryWindowInSeconds: 300).",
    ),
    max_conns: int | None = typer.Option(
        None,
        "--max-conns",
        callback=_max_conns,
        show_default=False,
        help="Most client connections open at once; more are closed on arrival "
        "(mongod's net.maxIncomingConnections). 1000 by default (fewer when 80% of the "
        "open-file limit, ulimit -n, is lower); at most that 80%, and 65536.",
    ),
    repair: bool = typer.Option(
        False,
        "--repair",
        help="Start even though the data files show acknowledged commits were lost (an "
        "emptied database file, a missing or truncated journal after a crash); the loss "
        "is accepted.",
    ),
    enable_test_commands: bool = typer.Option(
        False,
        "--enable-test-commands",
        help="Serve test commands such as configureFailPoint (mongod's enableTestCommands).",
    ),
    auth: bool = typer.Option(
        False,
        "--auth",
        help="Require authentication (SCRAM-SHA-256) and check every command against the "
        "user's roles (mongod's --auth). The first user: from 127.0.0.1 while none exists "
        "(the localhost exception), or ACCORD_ENGINE_ADMIN_USER / "
        "ACCORD_ENGINE_ADMIN_PASSWORD in the environment (a root user).",
    ),
) -> None:
    """Start the engine on DBPATH (in the background unless --foreground)."""
    if foreground:
        from accord.platform.embedded.foreground import serve

        code = serve(
            dbpath,
            host=host,
            port=port,
            sync=not no_sync,
            ttl_interval=ttl_interval,
            transaction_lifetime=transaction_lifetime,
            snapshot_history=snapshot_history_window,
            repair=repair,
            max_connections=max_conns,
            enable_test_commands=enable_test_commands,
            auth=auth,
        )
        raise typer.Exit(code)
    found = connection.read_lock(dbpath.resolve())
    if found:
        console.print(f"engine already running: pid {found[0]}, {connection.engine_uri(found[1])}")
        return
    options = [
        "--ttl-interval",
        str(ttl_interval),
        "--transaction-lifetime",
        str(transaction_lifetime),
        "--snapshot-history-window",
        str(snapshot_history_window),
    ]
    if max_conns is not None:  # (else the engine's default, from its own open-file limit)
        options += ["--max-conns", str(max_conns)]
    if repair:
        options.append("--repair")
    if enable_test_commands:
        options.append("--enable-test-commands")
    if auth:
        options.append("--auth")
    try:
        uri = connection.spawn_engine(
            dbpath.resolve(), port=port, host=host, sync=not no_sync,
            timeout=Settings().engine_start_timeout, options=options,
        )  # fmt: skip
    except AccordError as exc:  # an engine that cannot start: 2, as the engine's own exit
        raise fail(err_console, exc, failed=2) from exc
    console.print(f"engine started: {uri}  (dbpath {dbpath})", highlight=False)
    console.print(f"stop it with: accord engine stop --dbpath {dbpath}", highlight=False)


@engine_app.command("stop")
def engine_stop(dbpath: Path = DBPATH) -> None:
    """Stop the engine serving DBPATH."""
    if connection.stop_engine(dbpath):
        console.print(f"engine on {dbpath} stopped")
    else:
        console.print(f"no engine running on {dbpath}")


@engine_app.command("status")
def engine_status(dbpath: Path = DBPATH) -> None:
    """Show whether an engine serves DBPATH. Exit code 1 if not."""
    found = connection.read_lock(dbpath.resolve())
    if not found:
        console.print(f"no engine running on {dbpath}")
        raise typer.Exit(1)
    console.print(f"running: pid {found[0]}, {connection.engine_uri(found[1])}")


@engine_app.command("ls")
def engine_ls() -> None:
    """List the engines running on this machine (their data directory, port and pid)."""
    running = connection.running_engines()
    if not running:
        console.print("no engine running")
        return
    for e in running:
        # an engine started by other code on a path --dbpath refuses: quoted, escaped
        path = str(e["dbpath"])
        shown = repr(path) if _control_at(path) is not None else path
        console.print(
            f"{shown}  {connection.engine_uri(e['port'], e['host'])}  pid {e['pid']}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip


#: Entry-point group through which the other parts of accord (memory, governance) add
#: their commands, so the platform names none of them (DESIGN's dependency rule).
PLUGIN_GROUP = "accord.cli"


def load_plugins(target: typer.Typer) -> list[str]:
    """Call every ``accord.cli`` entry point's ``register(app)``; names of those loaded. A
    plugin that fails to load is reported and skipped: the rest of the CLI still works."""
    from importlib.metadata import entry_points

    loaded = []
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            ep.load()(target)
        except Exception as exc:  # a broken optional part must not break `accord engine`
            SafeConsole(stderr=True).print(
                f"[yellow]accord: {ep.name} commands unavailable:[/yellow] {exc}"
            )
            continue
        loaded.append(ep.name)
    return loaded


load_plugins(app)

if __name__ == "__main__":
    app()
