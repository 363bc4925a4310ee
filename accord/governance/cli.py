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
* ``hold | release VALUE --by tenant|thread|subject|class``, ``holds``: legal holds.
* ``sweep [--interval S] [--limit N] [--batch D] [--pause S]``: keep-latest-N checkpoints
  and expired threads, in bounded, paced batches.
* ``export-subject ID --out DIR``, ``erase ID [--yes] [--no-compact]``: a data subject's
  data exported (a JSONL file per class and a manifest) or erased from every class
  (docs/governance.md, "Data subjects").

Configuration: ``MONGODB_URI`` (else the embedded engine), ``ACCORD_POLICY``.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from accord.errors import AccordError, PolicyError
from accord.platform.cli_output import SafeConsole, database_name, fail, print_whole, text, whole

governance_app = typer.Typer(
    help="The governance policy: show, check, plan, apply; legal holds; retention sweeps; "
    "data subjects' export and erasure.",
    no_args_is_help=True,
)
console = SafeConsole(stderr=True, soft_wrap=True)  # lines a script may parse are never cut
out = SafeConsole(soft_wrap=True)

POLICY = typer.Option(
    None, "--policy", help="A policy file (default: ACCORD_POLICY, else the built-in default)."
)
DB = typer.Option("accord", "--db", help="The database the policy governs.", callback=database_name)
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


def _fail(err: AccordError) -> NoReturn:
    """One line on stderr; exit 2 for a bad flag, policy file or setting, else 1."""
    raise fail(console, err) from None


@governance_app.command("show")
def show(
    policy: Path | None = POLICY,
    toml: bool = typer.Option(False, "--toml"),
    db: str | None = typer.Option(
        None, "--db", callback=database_name,
        help="Show the policy stored in this database: what its processes enforce.",
    ),
    uri: str | None = URI,
) -> None:  # fmt: skip
    """The policy of the file (--policy, ACCORD_POLICY, else the built-in default), or
    with --db the one a database's processes enforce (its stored policy)."""
    from accord.governance.policy import DEPENDENT, class_of, to_toml

    if db is not None and policy is not None:
        console.print("[red]error:[/red] give --policy or --db, not both")
        raise typer.Exit(2)
    try:
        if db is None:
            effective = _policy(policy)
        else:
            from accord import runtime
            from accord.platform import connect
            from accord.platform.context import Principal

            client = connect(uri)
            try:
                admin = runtime.kernel(client, principal=Principal.os_user())
                effective = runtime.effective_policy(admin, db)
            finally:
                client.close()
    except AccordError as err:
        _fail(err)
    if toml:
        typer.echo(to_toml(effective), nl=False)  # as it is: no wrapping, no markup
        return
    names = list(effective.classes)
    collections = [c.collection or "(the application's)" for c in effective.classes.values()]
    classes = Table(whole("class", names), whole("collection", collections), "retention",
                    "audit", "data-subject fields",
                    title=f"policy {escape(effective.source)} (version {effective.version})")  # fmt: skip
    for name, cls in effective.classes.items():
        parent = DEPENDENT.get(class_of(name) or name)
        retention = f"with its {parent}" if parent else cls.retention.describe()
        classes.add_row(name, cls.collection or "(the application's)", retention, cls.audit,
                        ", ".join(cls.subject_fields) or "-")  # fmt: skip
    print_whole(out, classes)
    roles = Table(whole("class", names),
                  title="roles by classes (f find, i insert, u update, r remove)")  # fmt: skip
    for role in effective.roles():
        roles.add_column(role)
    for name, row in effective.table():
        roles.add_row(name, *(row[r] for r in effective.roles()))
    print_whole(out, roles)
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
    except PolicyError as err:  # its problems are what check reports: exit 1, as a linter's
        console.error(err)
        raise typer.Exit(1) from None
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
    policy: Path | None = POLICY, db: str = DB, uri: str | None = URI, users: bool = USERS,
    batch: int = typer.Option(
        1000, "--batch", min=1, max=100_000,
        help="Documents per transaction when expire_at is recomputed.",
    ),
) -> None:  # fmt: skip
    """Apply the policy to the database: roles, users (--users), the stored version (and
    expire_at recomputed when periods change; run it again after an interruption)."""
    from accord.governance.apply import apply, user_name

    try:
        uow, changes = _planned(uri, db, policy, users)
        with _progress() as bar:  # expire_at recomputed in batches when periods change
            done = apply(uow, changes, _advancer(bar, "recomputing expire_at"), batch=batch)
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


KIND = typer.Option(..., "--by", help="What the hold names: tenant, thread, subject or class.")
# text refused at the command line when it is not UTF-8 (cli_output.text): before, pymongo's
# UnicodeEncodeError came after the command had connected
HELD = typer.Argument(..., help="What the hold names (a tenant, thread, subject or class).",
                      callback=text)  # fmt: skip
TENANT = typer.Option(None, "--tenant", help="The tenant (of a thread; optional for a subject).",
                      callback=text)  # fmt: skip
REASON = typer.Option("", "--reason", help="Why (a case number): kept with the hold.",
                      callback=text)  # fmt: skip


def _kernel(uri: str | None) -> Any:
    from accord import runtime
    from accord.platform import connect
    from accord.platform.context import Principal

    return runtime.kernel(connect(uri), principal=Principal.os_user())


def _progress() -> Any:
    from rich.progress import Progress, SpinnerColumn, TextColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"),
                    TextColumn("{task.completed} documents"), console=console,
                    transient=True)  # fmt: skip


def _hold(kind: str, value: str, tenant: str | None, reason: str = "") -> Any:
    from accord.errors import InvalidInputError
    from accord.governance.holds import Hold

    if kind == "tenant" and tenant not in (None, value):  # (it was dropped without a word)
        raise InvalidInputError(f"a tenant hold names its tenant once: {value!r}, no --tenant")
    return Hold(kind, value, tenant if kind != "tenant" else None, reason=reason)  # type: ignore[arg-type]


@governance_app.command("hold")
def hold_command(
    value: str = HELD, by: str = KIND, tenant: str | None = TENANT, reason: str = REASON,
    db: str = DB, uri: str | None = URI,
) -> None:  # fmt: skip
    """Place a legal hold: what it names stops expiring and is not swept or erased."""
    import time

    from accord import runtime
    from accord.governance.holding import place
    from accord.governance.stored import interval_from_env

    try:
        uow = _kernel(uri)
        policy = runtime.effective_policy(uow, db)
        hold = _hold(by, value, tenant, reason)
        with _progress() as bar:
            task = bar.add_task("taking the expiry off", total=None)
            moved = place(uow, db, hold, policy, lambda _c, n: bar.advance(task, n))
            # a process that had not read the hold yet may have stamped a document since
            time.sleep(interval_from_env())
            moved += place(uow, db, hold, policy, lambda _c, n: bar.advance(task, n))
        uow.client.close()
    except AccordError as err:
        _fail(err)
    out.print(f"held {escape(hold.describe())} in {db}: {moved} document(s) no longer expire")


@governance_app.command("release")
def release_command(
    value: str = HELD, by: str = KIND, tenant: str | None = TENANT, db: str = DB,
    uri: str | None = URI,
) -> None:  # fmt: skip
    """Release a legal hold: what no other hold covers expires again as the policy says."""
    from accord import runtime
    from accord.governance.holding import release

    try:
        uow = _kernel(uri)
        policy = runtime.effective_policy(uow, db)
        hold = _hold(by, value, tenant)
        with _progress() as bar:
            task = bar.add_task("giving the expiry back", total=None)
            back = release(uow, db, hold, policy, lambda _c, n: bar.advance(task, n))
        uow.client.close()
    except AccordError as err:
        _fail(err)
    out.print(f"released {escape(hold.describe())} in {db}: {back} document(s) expire again")


@governance_app.command("holds")
def holds_command(db: str = DB, uri: str | None = URI) -> None:
    """List the legal holds of the database."""
    from accord import runtime
    from accord.governance.holding import list_holds

    try:
        uow = _kernel(uri)
        holds = list_holds(uow, db, runtime.effective_policy(uow, db))
        uow.client.close()
    except AccordError as err:
        _fail(err)
    if not holds:
        out.print(f"{db}: no legal holds")
        return
    table = Table("by", whole("value", [h.value for h in holds]),
                  whole("tenant", [h.tenant_id or "-" for h in holds]), "since", "placed by",
                  "reason")  # fmt: skip
    for h in holds:
        table.add_row(h.kind, escape(h.value), escape(h.tenant_id or "-"),
                      str(h.at)[:19] if h.at else "-", escape(h.by), escape(h.reason))  # fmt: skip
    print_whole(out, table)  # values whole: commands take them back


def _advancer(bar: Any, what: str) -> Any:
    task = bar.add_task(what, total=None)

    def advance(_collection: str, n: int) -> None:
        bar.advance(task, n)

    return advance


@governance_app.command("sweep")
def sweep_command(
    db: str = DB,
    uri: str | None = URI,
    limit: int = typer.Option(
        1000, "--limit", min=1, max=1_000_000, help="Threads per rule per pass (sweep_limit)."
    ),
    batch: int = typer.Option(
        1000, "--batch", min=1, max=100_000, help="Documents per transaction."
    ),
    pause: float = typer.Option(
        0.0, "--pause", min=0, max=3600, help="Seconds between transactions (pacing)."
    ),
    interval: float = typer.Option(
        0, "--interval", min=0, max=7 * 86_400, help="Run a pass every this many seconds (0: once)."
    ),
) -> None:
    """Keep the latest N checkpoints per thread and delete expired threads (held ones are
    skipped), in bounded, paced batches; with --interval, as a worker."""
    import time

    from accord import runtime
    from accord.platform import connect

    try:
        client = connect(uri)
        while True:
            with _progress() as bar:
                report = runtime.sweep(client, db, limit=limit, batch=batch, pause=pause,
                                       progress=_advancer(bar, "sweeping"))  # fmt: skip
            out.print(f"{db}: {report.describe()}")
            if not interval:
                break
            time.sleep(interval)
        client.close()
    except AccordError as err:
        _fail(err)


YES = typer.Option(False, "--yes", help="Do not ask for confirmation.")
NO_COMPACT = typer.Option(False, "--no-compact", help="Do not compact the storage afterwards.")
OUT = typer.Option(..., "--out", help="A new (or empty) directory to write to.")
SUBJECT_TENANT = typer.Option(None, "--tenant", help="Only this tenant's data of the subject.",
                              callback=text)  # fmt: skip
SUBJECT = typer.Argument(..., help="The data subject's identifier.", callback=text)
SHREDDED = typer.Argument(..., help="The tenant whose keys to destroy.", callback=text)


@governance_app.command("export-subject")
def export_subject_command(
    subject: str = SUBJECT,
    out: Path = OUT,
    tenant: str | None = SUBJECT_TENANT, db: str = DB, uri: str | None = URI,
) -> None:  # fmt: skip
    """Export everything accord holds about a data subject (GDPR Art. 15): a JSONL file
    per class and a manifest with counts and SHA-256s."""
    from accord import runtime
    from accord.platform import connect

    try:
        client = connect(uri)
        with _progress() as bar:
            manifest = runtime.export_subject_data(client, subject, out, db, tenant_id=tenant,
                                                   progress=_advancer(bar, "exporting"))  # fmt: skip
        client.close()
    except AccordError as err:
        _fail(err)
    for name, entry in sorted(manifest["files"].items()):
        typer.echo(f"  {name}: {entry['documents']} document(s), sha256 {entry['sha256'][:16]}")
    typer.echo(f"exported {manifest['documents']} document(s) of {len(manifest['threads'])} "
               f"thread(s) to {out} (manifest.json)")  # fmt: skip


@governance_app.command("erase")
def erase_command(
    subject: str = SUBJECT,
    tenant: str | None = SUBJECT_TENANT, db: str = DB, uri: str | None = URI,
    yes: bool = YES,
    no_compact: bool = NO_COMPACT,
) -> None:  # fmt: skip
    """Erase a data subject (GDPR Art. 17) from every class, unless a legal hold covers
    it; the erasure is recorded in the audit trail, whose chains still verify."""
    from accord import runtime
    from accord.platform import connect

    if not yes and not typer.confirm(
        f"erase every document of data subject {subject!r} from {db}? This cannot be undone"
    ):
        raise typer.Exit(1)
    try:
        client = connect(uri)
        with _progress() as bar:
            report = runtime.erase_subject_data(client, subject, db, tenant_id=tenant,
                                                compact=not no_compact,
                                                progress=_advancer(bar, "erasing"))  # fmt: skip
        client.close()
    except AccordError as err:
        _fail(err)
    out.print(f"{db}: {escape(report.describe())}")


@governance_app.command("shred-tenant")
def shred_tenant_command(
    tenant: str = SHREDDED, db: str = DB, uri: str | None = URI, yes: bool = YES,
) -> None:  # fmt: skip
    """Destroy every data key of a tenant (crypto-shredding): its encrypted payloads become
    unreadable in the database and in every backup and export, unless a legal hold covers
    the tenant. Documents are not deleted; the key deletions are audited."""
    from accord import runtime
    from accord.platform import connect

    if not yes and not typer.confirm(
        f"destroy every data key of tenant {tenant!r} in {db}? Its encrypted data can never "
        f"be read again"
    ):
        raise typer.Exit(1)
    try:
        client = connect(uri)
        destroyed = runtime.shred_tenant_keys(client, tenant, db)
        client.close()
    except AccordError as err:
        _fail(err)
    out.print(f"{db}: {destroyed} data key(s) of tenant {escape(repr(tenant))} destroyed")


@governance_app.command("rewrap-keys")
def rewrap_keys_command(db: str = DB, uri: str | None = URI) -> None:
    """Rotate the master key: re-wrap every data key under ACCORD_MASTER_KEY (the new
    key), unwrapping with ACCORD_MASTER_KEY_PREVIOUS (the old one). Idempotent; retire
    the old key once it reports 0."""
    from accord import runtime
    from accord.platform import connect

    try:
        client = connect(uri)
        done = runtime.rewrap_data_keys(client, db)
        client.close()
    except AccordError as err:
        _fail(err)
    out.print(f"{db}: {done} data key(s) re-wrapped under the current master key")


def register(app: typer.Typer) -> None:
    """The ``accord.cli`` entry point: add ``accord governance``."""
    app.add_typer(governance_app, name="governance")
