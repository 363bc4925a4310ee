"""governance's commands of the ``accord`` CLI: ``accord audit ...``.

They register on the platform's typer app through the ``accord.cli`` entry point
(pyproject.toml), so the platform names none of them.

- ``accord audit verify [--live] [--tenant T] [--db DB] [--json]`` recomputes every audit
  stream of the database (:func:`accord.governance.verify.verify_chain`) and prints each
  broken stream's first break (stream, seq, what, expected vs found);
  ``verify --from A --to B`` checks that digest B extends digest A
  (:func:`accord.governance.proofs.check_extends`); ``verify --proof FILE`` checks an
  inclusion proof without the database.
- ``accord audit keygen PATH``: an Ed25519 key pair to sign digests.
- ``accord audit digest [--key PATH | --key-env NAME] [--out FILE]``: take, store and
  print a digest (:mod:`accord.governance.digests`).
- ``accord audit prove RECORD_ID [--digest N]``: print an inclusion proof.

Exit status of the checks: 0 when everything verifies, 1 when something does not, 2 when
the check could not run.

Configuration: ``MONGODB_URI`` (else the embedded engine), ``ACCORD_DATABASE``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import typer

from accord.errors import AccordError
from accord.platform.cli_output import SafeConsole, database_name, fail, text

audit_app = typer.Typer(
    help="The audit trail: verify its hash chains, digest, prove, export.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
err = SafeConsole(stderr=True, soft_wrap=True)
out = SafeConsole(soft_wrap=True)

DBPATH = typer.Option(
    None, "--dbpath", help="Data directory of the embedded engine (default .accord/data)."
)


DB = typer.Option(
    None,
    "--db",
    help="The database (default ACCORD_DATABASE, else accord).",
    callback=database_name,
)
URI = typer.Option(None, "--uri", help="MongoDB URI (default: MONGODB_URI, else the engine).")
KEY = typer.Option(None, "--key", help="Sign with this Ed25519 private key (PEM file).")
KEY_ENV = typer.Option(
    None, "--key-env", help="Sign with the Ed25519 private key (PEM) in this environment variable."
)
PUBLIC_KEY = typer.Option(
    None, "--public-key", help="Require signatures by this public key (PEM, keygen's .pub)."
)
JSON_OUT = typer.Option(False, "--json", help="Print the report as JSON.")
TENANT = typer.Option(None, "--tenant", help="Only this tenant's streams.", callback=text)
KEY_PATH = typer.Argument(..., help="Where to write the private key.")
DIGEST_OUT = typer.Option(
    None, "--out", help="Also write the digest (JSON) to this file, to keep outside; "
    "{seq} in the name is replaced by the digest's number.",
)  # fmt: skip
EVERY = typer.Option(
    None, "--every", help="Take a digest every interval (e.g. 15m, 1h) until stopped."
)
COUNT = typer.Option(None, "--count", help="With --every: stop after this many digests.")
AGAINST = typer.Option(None, "--digest", help="Against this digest (default the latest).")
EXPORT_DIR = typer.Argument(
    None, help="An export (accord audit export) to verify without the database."
)
LIVE = typer.Option(False, "--live", help="Verify the database's chains (the default).")
FROM = typer.Option(None, "--from", help="Digest A (a JSON file kept outside, or a digest number).")
TO = typer.Option(None, "--to", help="Digest B, which must extend A.")
PROOF = typer.Option(None, "--proof", help="Check this inclusion proof (JSON file).")
EXPORT_TENANT = typer.Option(
    ..., "--tenant", help="The tenant whose records to export.", callback=text
)
EXPORT_OUT = typer.Option(
    ..., "--out", help="The directory to write (new, or an unfinished export)."
)
EXPORT_FORMAT_OPT = typer.Option("jsonl", "--format", help="jsonl, csv or parquet (pyarrow).")
PART_SIZE_OPT = typer.Option(
    100_000, "--part-size", min=1, max=10_000_000,
    help="Records per file (a resumed export must use the same).",
)  # fmt: skip
SINCE = typer.Option(None, "--since", help="Each stream from its first record at or after this.")
UNTIL = typer.Option(None, "--until", help="Up to the last digest taken at or before this.")
CLASS_OPT = typer.Option(None, "--class", help="Only the streams holding records of this class.")
AUDIT_PERIOD = typer.Option(
    None, "--audit-period", help="Hold audit cuts to this period (e.g. 7y; default the "
    "stored policy's audit period, or an export's manifest's).",
)  # fmt: skip
MAX_JSON_MIB = typer.Option(
    None, "--max-json-mib", min=1, max=1 << 20,
    help="Read an export's manifest.json and digests.json up to this size (MiB; default "
    "16 and 64): a genuine export of more streams or digests than those allow.",
)  # fmt: skip
KEPT_DIGEST = typer.Option(
    None, "--digest", help="The digest kept outside, which a proof or export must match."
)


def _fail(exc: Exception) -> typer.Exit:
    """One line on stderr, exit 2: the command could not run, whether a flag or setting
    was bad or the database failed (exit 1 is ``verify``'s finding: problems in an
    export, so a script never takes a failure to run for a tampered export)."""
    return fail(err, exc, failed=2)


def _print_json(value: Any) -> None:
    out.print(json.dumps(value, default=str, indent=2), highlight=False, markup=False)


@contextmanager
def _kernel(
    uri: str | None, dbpath: Path | None, db: str | None, *, setup: bool = False
) -> Iterator[tuple[Any, str]]:
    """A kernel acting as the operating-system user in the ``auditor`` role, on ``db``
    (``setup``: with the audit collections, digests included, created first)."""
    from accord import runtime
    from accord.platform import connect
    from accord.platform.context import AUDITOR, Principal
    from accord.platform.settings import Settings
    from accord.platform.synchronous.catalog import Catalog

    client: Any = None
    try:
        client = connect(uri, data_dir=dbpath)
        mode = os.environ.get(runtime.AUDIT_ENV, "").strip().lower()
        uow = runtime.kernel(
            client, principal=Principal.os_user(AUDITOR),
            audit=mode if mode not in ("", "off") else "metadata",
        )  # fmt: skip
        name = db or Settings().database
        if setup:
            # creating collections is the admin's (the CLI's user's) part
            Catalog(uow.acting_as(Principal.os_user()), name).setup("audit", {})
        yield uow, name
    finally:
        if client is not None:
            client.close()


def _load_json(path: Path, what: str) -> dict[str, Any]:
    from accord.errors import InvalidInputError

    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"cannot read {what} {path}: {exc}") from None
    except RecursionError:  # (a traceback before)
        raise InvalidInputError(f"cannot read {what} {path}: nested too deep") from None
    if not isinstance(value, dict):
        raise InvalidInputError(f"{path} is not {what} (a JSON object)")
    return value


def _load_digest(path: Path) -> dict[str, Any]:
    """The digest kept outside in ``path``: a JSON object whose ``seq`` is a digest
    number and whose ``hash`` is text, else a clear error (exit 2); a seq past int64
    reached the database's query as an OverflowError traceback."""
    from accord.errors import InvalidInputError

    doc = _load_json(path, "a digest")
    seq = doc.get("seq")
    if (
        isinstance(seq, bool)
        or not isinstance(seq, int)
        or not 1 <= seq <= MAX_DIGEST
        or not isinstance(doc.get("hash"), str)
    ):  # (a KeyError traceback before)
        raise InvalidInputError(
            f"{path} is not an audit digest: it needs seq (1 to {MAX_DIGEST}) and hash, as "
            f"`accord audit digest` writes them"
        )
    return doc


def _digest_arg(uow: Any, db: str, value: str) -> Mapping[str, Any]:
    """A digest named on the command line: a JSON file kept outside, else a seq."""
    from accord.errors import InvalidInputError
    from accord.governance.digests import external, list_digests

    path = Path(value)
    if path.exists():
        return _load_digest(path)
    seq = _digest_number(value)
    if seq is None:
        raise InvalidInputError(f"{value!r} is neither a digest file nor a digest number")
    found = [d for d in list_digests(uow, db, upto=seq) if d["seq"] == seq]
    if not found:
        raise InvalidInputError(f"no audit digest {value} in {db}")
    return external(found[0])


#: Digest numbers are BSON int64s: a larger one is no digest (and MongoDB refuses it).
MAX_DIGEST = 2**63 - 1


def _digest_number(value: str) -> int | None:
    """``value`` as a digest number: ASCII digits ('²'.isdigit() is true, int() refuses
    it), within int64; else None."""
    if not value.isascii() or not value.isdigit():
        return None
    seq = int(value)
    return seq if 1 <= seq <= MAX_DIGEST else None


@audit_app.command("keygen")
def keygen(path: Path = KEY_PATH) -> None:
    """Write a new Ed25519 key pair: PATH (private, mode 0600) and PATH.pub (public)."""
    from accord.governance.signing import generate, key_id, load_public

    try:
        private, public = generate(path)
    except AccordError as exc:
        raise _fail(exc) from exc
    out.print(f"wrote {private} and {public} (key {key_id(load_public(public))})",
              highlight=False, markup=False)  # fmt: skip


@audit_app.command("digest")
def digest(
    db: str | None = DB,
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    key: Path | None = KEY,
    key_env: str | None = KEY_ENV,
    out_file: str | None = DIGEST_OUT,
    every: str | None = EVERY,
    count: int | None = COUNT,
) -> None:
    """Take a digest of every audit stream's head: store it and print it as JSON (with
    --every, one per interval until stopped or --count digests)."""
    import time

    from accord.errors import InvalidInputError
    from accord.governance.digests import external, write_digest
    from accord.governance.policy import parse_duration
    from accord.governance.signing import load_private

    try:
        signing = load_private(key, key_env)
        try:  # (seconds as digits: '60', as the message says)
            given: str | int | None = int(every) if every is not None and every.isdigit() else every
            interval = parse_duration(given).total_seconds() if given is not None else None
        except ValueError as exc:
            raise InvalidInputError(f"--every: {exc}") from None
        folder = Path(out_file).parent if out_file is not None else None
        if folder is not None and not folder.is_dir():  # before a digest is taken
            raise InvalidInputError(f"--out: no directory {folder}; no digest was taken")
        if out_file is not None and Path(out_file).is_dir():
            raise InvalidInputError(f"--out: {out_file} is a directory; no digest was taken")
        with _kernel(uri, dbpath, db, setup=True) as (uow, name):
            taken = 0
            while True:
                doc = external(write_digest(uow, name, key=signing))
                text = json.dumps(doc, indent=2)
                out.print(text, highlight=False, markup=False)  # first: never lost
                if out_file is not None:  # "{seq}" in the name: one file per digest
                    target = Path(out_file.replace("{seq}", f"{doc['seq']:06d}"))
                    try:
                        _write_whole(target, text + "\n")
                    except OSError as exc:
                        raise InvalidInputError(
                            f"--out: could not write {target} ({exc.strerror}); digest "
                            f"{doc['seq']} is stored in {name} and printed above"
                        ) from None
                taken += 1
                if interval is None or (count is not None and taken >= count):
                    break
                time.sleep(interval)
    except AccordError as exc:
        raise _fail(exc) from exc


def _write_whole(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a digest kept outside must never be torn, and a
    fixed ``--out`` name must keep the previous digest until the next one is complete (a
    process killed mid-write left an empty file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # (a directory named --out left the temporary file)
        raise


@audit_app.command("prove")
def prove(
    record_id: str = typer.Argument(..., help="The audit record's _id (24 hex digits)."),
    digest_seq: int | None = AGAINST,
    db: str | None = DB,
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
) -> None:
    """Print an inclusion proof of one record against a digest (JSON; check it with
    `accord audit verify --proof FILE`)."""
    from accord.errors import InvalidInputError
    from accord.governance.proofs import prove as build

    try:
        if digest_seq is not None and not 1 <= digest_seq <= MAX_DIGEST:
            raise InvalidInputError(
                f"--digest {digest_seq} is no digest number (1 to {MAX_DIGEST})"
            )
        with _kernel(uri, dbpath, db) as (uow, name):
            proof = build(uow, name, record_id, digest=digest_seq)
    except AccordError as exc:
        raise _fail(exc) from exc
    _print_json(proof)


@audit_app.command("verify")
def verify(
    directory: Path | None = EXPORT_DIR,
    live: bool = LIVE,
    start: str | None = FROM,
    to: str | None = TO,
    proof: Path | None = PROOF,
    digest_file: Path | None = KEPT_DIGEST,
    public_key: Path | None = PUBLIC_KEY,
    tenant: str | None = TENANT,
    db: str | None = DB,
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    as_json: bool = JSON_OUT,
    audit_period: str | None = AUDIT_PERIOD,
    max_json_mib: int | None = MAX_JSON_MIB,
) -> None:
    """Recompute the audit chains (live, or an export), check a digest's extension or
    an inclusion proof; report the first break of each broken stream."""
    from accord.governance.signing import load_public

    try:
        pinned = load_public(public_key) if public_key is not None else None
        kept = _load_digest(digest_file) if digest_file is not None else None
        period = _period(audit_period)
    except AccordError as exc:
        raise _fail(exc) from exc
    if proof is not None:
        _verify_proof(proof, kept, pinned, as_json)
    elif directory is not None:
        limit = max_json_mib << 20 if max_json_mib is not None else None
        _verify_export(directory, kept, pinned, as_json, period, limit)
    elif start is not None or to is not None:
        _verify_extension(start, to, pinned, db, uri, dbpath, as_json, period)
    else:
        _verify_live(tenant, db, uri, dbpath, as_json, kept, pinned, period)


def _verify_proof(path: Path, kept: Any, pinned: Any, as_json: bool) -> None:
    from accord.governance.proofs import check_proof

    try:
        problem = check_proof(_load_json(path, "a proof"), digest=kept, pinned=pinned)
    except AccordError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json({"ok": problem is None, "problem": problem})
    else:
        out.print(problem or "the proof holds: the record is in the digest's history",
                  highlight=False, markup=False)  # fmt: skip
    if problem is not None:
        raise typer.Exit(1)


def _verify_extension(
    start: str | None, to: str | None, pinned: Any, db: str | None, uri: str | None,
    dbpath: Path | None, as_json: bool, period: Any,
) -> None:  # fmt: skip
    from accord.errors import InvalidInputError
    from accord.governance.proofs import check_extends

    try:
        if start is None or to is None:
            raise InvalidInputError("--from and --to go together: name both digests")
        with _kernel(uri, dbpath, db) as (uow, name):
            report = check_extends(
                uow, name, _digest_arg(uow, name, start), _digest_arg(uow, name, to),
                pinned=pinned, audit_period=period,
            )  # fmt: skip
    except AccordError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(report.as_dict())
    else:
        for found in report.problems:
            out.print(found.describe() if found.stream else found.problem,
                      highlight=False, markup=False)  # fmt: skip
        verdict = "extends" if report.ok else "does NOT extend"
        out.print(f"digest {report.to} {verdict} digest {report.start} "
                  f"({report.streams} streams checked)", highlight=False, markup=False)  # fmt: skip
    if not report.ok:
        raise typer.Exit(1)


def _period(value: str | None) -> Any:
    """``--audit-period``'s duration (policy.py's syntax: 7y, 90d), None when not given."""
    from accord.errors import InvalidInputError
    from accord.governance.policy import parse_duration

    try:
        return parse_duration(value) if value is not None else None
    except ValueError as exc:
        raise InvalidInputError(f"--audit-period: {exc}") from None


def _verify_export(
    directory: Path,
    kept: Any,
    pinned: Any,
    as_json: bool,
    period: Any = None,
    json_limit: int | None = None,
) -> None:
    from accord.errors import InvalidInputError
    from accord.governance.export_verify import verify_export

    try:
        if not directory.is_dir():  # nothing to check: the check could not run (2), not fail (1)
            raise InvalidInputError(f"{directory} is not a directory (an export to verify)")
        report = verify_export(directory, kept=kept, pinned=pinned, audit_period=period,
                               json_limit=json_limit)  # fmt: skip
    except AccordError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(report.as_dict())
    else:
        for found in report.problems:
            out.print(found.describe(), highlight=False, markup=False)
        out.print(report.summary(directory), highlight=False, markup=False)
    if not report.ok:
        raise typer.Exit(1)


@audit_app.command("export")
def export(
    tenant: str = EXPORT_TENANT,
    out_dir: Path = EXPORT_OUT,
    fmt: str = EXPORT_FORMAT_OPT,
    since: datetime | None = SINCE,
    until: datetime | None = UNTIL,
    artifact: str | None = CLASS_OPT,
    key: Path | None = KEY,
    key_env: str | None = KEY_ENV,
    db: str | None = DB,
    uri: str | None = URI,
    dbpath: Path | None = DBPATH,
    part_size: int = PART_SIZE_OPT,
) -> None:
    """Export a tenant's audit records, the digests covering them and a manifest to
    OUT (resumes an interrupted export into the same OUT)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from accord.governance.export import export as run
    from accord.governance.signing import load_private

    try:
        signing = load_private(key, key_env)
        bar = Progress(
            "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
            TimeRemainingColumn(), console=err, transient=True,
        )  # fmt: skip
        with _kernel(uri, dbpath, db) as (uow, name), bar:
            task = bar.add_task(f"exporting {tenant}", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            manifest = run(
                uow, name, out_dir, tenant=tenant, since=since, until=until,
                artifact=artifact, fmt=fmt, key=signing, progress=progress,  # type: ignore[arg-type]
                part_size=part_size,
            )  # fmt: skip
    except AccordError as exc:
        raise _fail(exc) from exc
    out.print(
        f"exported {manifest['records']} records of tenant {tenant!r} in "
        f"{len(manifest['streams'])} streams to {out_dir} (covered by digest "
        f"{manifest['digest']['seq']})", highlight=False, markup=False,
    )  # fmt: skip


def _verify_live(
    tenant: str | None, db: str | None, uri: str | None, dbpath: Path | None, as_json: bool,
    kept: Mapping[str, Any] | None = None, pinned: Any = None, period: Any = None,
) -> None:  # fmt: skip
    from accord.governance.proofs import check_live_against
    from accord.governance.verify import verify_chain

    try:
        with _kernel(uri, dbpath, db) as (uow, name):
            report = verify_chain(uow, name, tenant=tenant, principal=uow.principal,
                                  audit_period=period, pinned=pinned)  # fmt: skip
            if kept is not None:  # the chains must still hold what the kept digest saw
                broken = {b.stream for b in report.breaks}
                report.breaks.extend(
                    b for b in check_live_against(uow, name, kept, pinned=pinned)
                    if b.stream not in broken
                    and (tenant is None or not b.stream or _tenant_of(b.stream) == tenant)
                )  # fmt: skip
    except AccordError as exc:
        raise _fail(exc) from exc
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


def _tenant_of(stream: str) -> Any:
    """The tenant a stream's name says: its first part, as JSON (a tenant with a quote or
    a backslash is escaped in the name, so no prefix of the raw text matches it)."""
    try:
        parts = json.loads(stream)
    except ValueError:
        return None
    return parts[0] if isinstance(parts, list) and parts else None


def register(app: typer.Typer) -> None:
    """Entry point (``accord.cli``): add the audit commands to the ``accord`` app."""
    app.add_typer(audit_app, name="audit")
