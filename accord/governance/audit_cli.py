"""governance's commands of the ``accord`` CLI: ``accord audit verify``.

They register on the platform's typer app through the ``accord.cli`` entry point
(pyproject.toml), so the platform names none of them.

``accord audit verify [--tenant T] [--db DB] [--json]`` recomputes every audit stream of
the database (:func:`accord.governance.verify.verify_chain`) and prints each broken
stream's first break (stream, seq, what, expected vs found). Exit status: 0 when every
chain verifies, 1 when one does not, 2 when the check could not run.

Configuration: ``MONGODB_URI`` (else the embedded engine), ``ACCORD_DATABASE``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from accord.errors import AccordError

audit_app = typer.Typer(
    help="The audit trail: verify its hash chains.", no_args_is_help=True, rich_markup_mode=None
)
err = Console(stderr=True)
out = Console(soft_wrap=True)

DBPATH = typer.Option(
    None, "--dbpath", help="Data directory of the embedded engine (default .accord/data)."
)


@audit_app.command("verify")
def verify(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's streams."),
    db: str | None = typer.Option(
        None, "--db", help="The database (default ACCORD_DATABASE, else accord)."
    ),
    uri: str | None = typer.Option(
        None, "--uri", help="MongoDB URI (default: MONGODB_URI, else the engine)."
    ),
    dbpath: Path | None = DBPATH,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Recompute every audit chain and report the first break of each broken stream."""
    from accord import runtime
    from accord.governance.verify import verify_chain
    from accord.platform import connect
    from accord.platform.context import AUDITOR, Principal
    from accord.platform.settings import Settings

    client: Any = None
    try:
        client = connect(uri, data_dir=dbpath)
        principal = Principal.os_user(AUDITOR)
        uow = runtime.kernel(client, principal=principal)
        report = verify_chain(uow, db or Settings().database, tenant=tenant, principal=principal)
    except AccordError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    finally:
        if client is not None:
            client.close()
    if as_json:
        out.print(json.dumps(report.as_dict(), default=str), highlight=False, markup=False)
    else:
        scope = f" of tenant {tenant!r}" if tenant else ""
        for found in report.breaks:
            out.print(found.describe(), highlight=False, markup=False)
        verdict = "verified" if report.ok else f"{len(report.breaks)} broken"
        out.print(
            f"{report.records} audit records in {report.streams} streams{scope}: {verdict}",
            highlight=False, markup=False,
        )  # fmt: skip
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Entry point (``accord.cli``): add the audit commands to the ``accord`` app."""
    app.add_typer(audit_app, name="audit")
