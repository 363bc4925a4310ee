"""The governance commands of the ``accord`` CLI: ``accord governance show | check | plan |
apply``. They register on the platform's typer app through the ``accord.cli`` entry point
(pyproject.toml).

* ``show``: the effective policy (a file's, ``ACCORD_POLICY``'s, or the built-in default):
  the classes with their retention, audit mode and data-subject fields, and the roles by
  classes; ``--toml`` prints it as a policy file naming every class.
* ``check FILE``: the file's problems, each with its line (exit 1), or that it is valid.
* ``plan``: what ``apply`` would change in the database (roles, users, the stored policy);
  ``--atlas-roles DIR`` writes the roles as Atlas custom database role JSON instead.
* ``apply``: makes it so, idempotently (docs/governance.md, "Applying the policy").

Configuration: ``MONGODB_URI`` (else the embedded engine), ``ACCORD_POLICY``.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from accord.errors import AccordError

governance_app = typer.Typer(
    help="The governance policy: show it, check a file, plan and apply it to a database.",
    no_args_is_help=True,
)
console = Console(stderr=True)
out = Console()

POLICY = typer.Option(
    None, "--policy", help="A policy file (default: ACCORD_POLICY, else the built-in default)."
)
DB = typer.Option("accord", "--db", help="The database the policy governs.")
URI = typer.Option(None, "--uri", help="MongoDB URI (default: MONGODB_URI, else the engine).")
ATLAS_ROLES = typer.Option(
    None, "--atlas-roles", help="Write the roles as Atlas custom role JSON files here."
)
USERS = typer.Option(
    False, "--users", help="Also create the service users accord-ROLE (passwords printed once)."
)


def _policy(path: Path | None) -> Any:
    from accord.governance.loading import resolve_policy

    return resolve_policy(path)


def _fail(err: AccordError) -> None:
    console.print(f"[red]error:[/red] {escape(str(err))}")
    raise typer.Exit(1) from None


@governance_app.command("show")
def show(policy: Path | None = POLICY, toml: bool = typer.Option(False, "--toml")) -> None:
    """The effective policy."""
    from accord.governance.policy import DEPENDENT, class_of, to_toml

    try:
        effective = _policy(policy)
    except AccordError as err:
        _fail(err)
    if toml:
        typer.echo(to_toml(effective), nl=False)  # as it is: no wrapping, no markup
        return
    classes = Table(title=f"policy {escape(effective.source)} (version {effective.version})")
    for column in ("class", "collection", "retention", "audit", "data-subject fields"):
        classes.add_column(column)
    for name, cls in effective.classes.items():
        parent = DEPENDENT.get(class_of(name) or name)
        retention = f"with its {parent}" if parent else cls.retention.describe()
        classes.add_row(name, cls.collection or "(the application's)", retention, cls.audit,
                        ", ".join(cls.subject_fields) or "-")  # fmt: skip
    out.print(classes)
    roles = Table(title="roles by classes (f find, i insert, u update, r remove)")
    roles.add_column("class")
    for role in effective.roles():
        roles.add_column(role)
    for name, row in effective.table():
        roles.add_row(name, *(row[r] for r in effective.roles()))
    out.print(roles)
    named = [(n, c.principals) for n, c in effective.classes.items() if c.principals]
    for name, grants in named:
        for who, actions in grants.items():
            out.print(f"{name}: principal {escape(who)} may {', '.join(sorted(actions))}")


@governance_app.command("check")
def check(policy: Path) -> None:
    """Check a policy file: its problems with their lines, or that it is valid."""
    from accord.governance.loading import load_policy

    try:
        load_policy(policy)
    except AccordError as err:
        _fail(err)
    out.print(f"{escape(str(policy))}: a valid policy")


def _planned(uri: str | None, db: str, policy: Path | None, users: bool) -> tuple[Any, Any]:
    from accord import runtime
    from accord.governance.apply import plan
    from accord.platform import connect
    from accord.platform.context import Principal

    effective = _policy(policy)
    client = connect(uri)
    uow = runtime.kernel(client, principal=Principal.os_user(), policy=effective)
    passwords = {role: secrets.token_urlsafe(24) for role in effective.roles()} if users else {}
    return uow, plan(uow, db, effective, users=passwords)


def _print(changes: Any) -> None:
    if not changes:
        out.print(f"{changes.db}: the policy is applied; nothing to change")
        return
    for change in changes.changes:
        out.print(f"  [bold]{change.kind}[/bold] {escape(change.target)}: {escape(change.detail)}")


@governance_app.command("plan")
def plan_command(
    policy: Path | None = POLICY, db: str = DB, uri: str | None = URI, users: bool = USERS,
    atlas_roles: Path | None = ATLAS_ROLES,
) -> None:  # fmt: skip
    """What apply would change (nothing is changed)."""
    if atlas_roles is not None:
        from accord.governance.apply import atlas_files

        try:
            written = atlas_files(_policy(policy), db, atlas_roles)
        except AccordError as err:
            _fail(err)
        for path in written:
            out.print(f"wrote {escape(str(path))}  (atlas customDbRoles create ... --file)")
        return
    try:
        uow, changes = _planned(uri, db, policy, users)
        uow.client.close()
    except AccordError as err:
        _fail(err)
    _print(changes)


@governance_app.command("apply")
def apply_command(
    policy: Path | None = POLICY, db: str = DB, uri: str | None = URI, users: bool = USERS
) -> None:
    """Apply the policy to the database: roles, users (--users), the stored version."""
    from accord.governance.apply import apply, user_name

    try:
        uow, changes = _planned(uri, db, policy, users)
        done = apply(uow, changes)
        uow.client.close()
    except AccordError as err:
        _fail(err)
    _print(changes)
    for change in done:
        if change.kind == "create user" and change.command is not None:
            role = str(change.command["createUser"]).removeprefix("accord-")
            out.print(
                f"user {user_name(role)} password (shown once): "
                f"{escape(str(change.command['pwd']))}"
            )
    if done:
        out.print(f"applied {len(done)} change(s) to {db}")


def register(app: typer.Typer) -> None:
    """The ``accord.cli`` entry point: add ``accord governance``."""
    app.add_typer(governance_app, name="governance")
