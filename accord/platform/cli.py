"""The ``accord`` command line."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from accord.errors import AccordError
from accord.platform import connection

app = typer.Typer(
    help="accord: transactional state and memory for LangGraph agents on MongoDB.",
    no_args_is_help=True,
)
engine_app = typer.Typer(help="Run the embedded MongoDB-compatible engine.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")
console = Console()

DBPATH = typer.Option(Path(".accord/data"), "--dbpath", help="Data directory of the engine.")


@engine_app.command("start")
def engine_start(
    dbpath: Path = DBPATH,
    port: int = typer.Option(
        27017, "--port", min=0, max=65535, help="TCP port (0: any free port)."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind; 127.0.0.1 unless you mean it."
    ),
    foreground: bool = typer.Option(
        False, "--foreground", help="Run in this terminal until Ctrl-C."
    ),
    no_sync: bool = typer.Option(False, "--no-sync", help="Skip fsync on commit (tests only)."),
) -> None:
    """Start the engine on DBPATH (in the background unless --foreground)."""
    if foreground:
        from accord.platform.embedded.__main__ import main

        args = ["--dbpath", str(dbpath), "--port", str(port), "--host", host]
        raise typer.Exit(main(args + (["--no-sync"] if no_sync else [])))
    found = connection.read_lock(dbpath.resolve())
    if found:
        console.print(f"engine already running: pid {found[0]}, {connection.engine_uri(found[1])}")
        return
    try:
        uri = connection.spawn_engine(
            dbpath.resolve(), port=port, host=host, sync=not no_sync, timeout=20.0
        )
    except AccordError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"engine started: {uri}  (dbpath {dbpath})")


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


if __name__ == "__main__":
    app()
