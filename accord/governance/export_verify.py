"""Verifying a compliance export from its files alone: no database, no private key.

:func:`verify_export` recomputes, from what :mod:`accord.governance.export` wrote:

1. the manifest's signature (by the pinned public key, when one is given) and every
   file's SHA-256 and size against the manifest;
2. the digests: each hashes to its ``hash``, is signed (when signed; by the pinned key),
   links to the previous one, and the tenant's stream heads it lists rebuild, through
   the tenant's audit path, the digest's Merkle root (an entry that lists none, its
   heads not having moved, rebuilds it from the last listed ones); the digest kept
   outside the export (``kept``), when given, must be the export's digest of its number,
   and its entry must prove the tenant's heads at it (later digests may be forged);
3. every record, in file order, stream by stream
   (:class:`~accord.governance.verify.ChainChecker`): its ``seq`` follows, its ``prev``
   is the previous record's ``hash``, it hashes to its ``hash``, its images hash to the
   hashes the chain covers; a record at a digest's head seq has that head's hash; CSV
   and Parquet columns agree with the record they show;
4. at the end of each stream, that it reaches the covering digest's head; that no
   stream of the digest is missing (an export without filters) and none is unknown to
   it; that a stream starting at an audit cut holds the record of the cut's insert.

Before its chain, each record must be the manifest tenant's (its ``tenant_id`` and its
stream's name; the digest entries' ``tenant`` too), and its line the record's canonical
JSON byte for byte (a duplicate key is another text); a stream met again after another
is a break; no two records share an ``_id`` (an ObjectId); the covering digest must
carry the tenant's heads; unknown versions of the manifest or of a digest are refused;
the files the manifest names are plain names in the export, regular files. A record, line or file of a shape no export writes
is a problem naming it, and the rest is still checked.

**Bounded memory** (since 2026-12-07): the export may be an attacker's, so nothing is
read whole on its word. ``manifest.json`` and ``digests.json`` are refused past
:data:`MANIFEST_LIMIT` and :data:`DIGESTS_LIMIT` bytes (``json_limit`` raises both for a
genuine export of that many streams or digests) before they are read; a JSONL line or a
CSV row past :data:`LINE_LIMIT` is named and dropped as it is read; a Parquet file's
footer and each row group's metadata (rows, bytes, each column chunk's bytes) are checked
against :data:`PARQUET_FOOTER_LIMIT`, :data:`ROW_GROUP_ROWS` and :data:`ROW_GROUP_BYTES`
before the row group is read, then each column chunk's page headers against its metadata
(:mod:`~accord.governance.parquet_pages`: pyarrow allocates what a page header claims);
a string column whose chunks declare a dictionary is read as one (a value repeated in
every row is held once), and each batch is decoded in slices of about :data:`BATCH_BYTES`.

Each problem names the first record it found wrong (stream, seq, ``_id``, file and line)
and what was expected. An attacker who edits records and recomputes the manifest
(hashes, counts, ranges) is still caught by 3 and 4; one who also rewrites the chains
and the digests in the export is caught by the digest's signature or by the digest kept
outside (2).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from array import array
from collections.abc import Generator, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from json.scanner import make_scanner
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accord.governance.audit_cuts import (
    Commit,
    audit_period,
    commits_of,
    cut_hash,
    image_hash,
    is_cut_record,
    justify_cut,
    when,
)
from accord.governance.audit_records import GENESIS
from accord.governance.canonical import Double, canonical_read
from accord.governance.digests import digest_problem, root_via, tenant_leaf, tenant_root_from
from accord.governance.export import (
    COLUMNS,
    DIGEST_VERSION,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    PROGRESS,
    columns_of,
    pyarrow_modules,
)
from accord.governance.parquet_pages import chunk_problem
from accord.governance.verify import ChainChecker, read_chain_hash

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["ExportProblem", "ExportReport", "verify_export"]

#: The largest ``manifest.json`` read, in bytes. A real one holds about 300 bytes per
#: stream (its range; with an audit cut, about 800) and 200 per records file: 16 MiB is
#: some 20,000 to 50,000 streams (a 1M-record export of 100 streams: 29 KB).
MANIFEST_LIMIT = 16 << 20
#: The largest ``digests.json`` read, in bytes. A real one holds about 1 KB per digest
#: plus, for each digest that moved the tenant's heads, about 130 bytes per stream of the
#: tenant: 64 MiB is e.g. 5,000 such digests of 100 streams (a 1M-record export of 100
#: streams and one digest: 14 KB).
DIGESTS_LIMIT = 64 << 20
#: The largest Parquet footer (the file's metadata) read: a real one holds about 250
#: bytes per column chunk (16 per row group; a binary column's statistics at most 8 KB),
#: some 80 KB per 100,000-record file.
PARQUET_FOOTER_LIMIT = 16 << 20
#: The most rows in a Parquet row group: the export writes at most 5,000 (and pyarrow,
#: by default, at most 2^20).
ROW_GROUP_ROWS = 1 << 20
#: The most bytes of a Parquet row group (its data uncompressed, and compressed; each
#: column chunk's too): the export (since 2026-12-07) ends a row group at
#: :data:`~accord.governance.export.ROW_GROUP_BYTES` of records, one record past at most
#: (a record is at most about 32 MiB of JSON).
ROW_GROUP_BYTES = 256 << 20
#: About how many bytes of a row group one Parquet batch holds (rows by the row group's
#: average row; at most 2,000 rows, at least one), and the most bytes of a batch decoded
#: at once (its dictionary columns' values, each row's counted: a slice of the batch; at
#: least one row).
BATCH_BYTES = 32 << 20


@dataclass(frozen=True)
class ExportProblem:
    """What is wrong, and where: the record (``stream``, ``seq``, ``record_id``,
    ``location`` file:line) when it is one, else the file or digest."""

    problem: str
    stream: str | None = None
    seq: int | None = None
    record_id: str | None = None
    location: str | None = None
    expected: Any = None
    found: Any = None

    def describe(self) -> str:
        where = []
        if self.stream is not None:
            where.append(f"stream {self.stream}")
        if self.seq is not None:
            where.append(f"seq {self.seq}")
        if self.record_id:
            where.append(f"record {self.record_id}")
        if self.location:
            where.append(f"at {self.location}")
        text = f"{', '.join(where)}: {self.problem}" if where else self.problem
        if self.expected is not None or self.found is not None:
            text += f" (expected {self.expected!r}, found {self.found!r})"
        return text


@dataclass
class ExportReport:
    """What :func:`verify_export` found; ``ok`` when nothing is wrong."""

    records: int = 0
    streams: int = 0
    digests: int = 0
    #: the tenant the manifest names (every record, stream and digest entry must be its)
    tenant: str | None = None
    #: the manifest's filters (``since``, ``class``) of a filtered export: what they left
    #: out is outside the export's proof, and that it was rightly left out rests on them
    filters: dict[str, Any] = field(default_factory=dict)
    problems: list[ExportProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "tenant": self.tenant, "records": self.records,
                "streams": self.streams, "digests": self.digests, "filters": self.filters,
                "problems": [asdict(p) for p in self.problems]}  # fmt: skip

    def summary(self, directory: Path | str) -> str:
        """One line: the tenant, the counts, any filter, the verdict."""
        verdict = "verified" if self.ok else f"{len(self.problems)} problem(s)"
        who = f" of tenant {self.tenant!r}" if self.tenant is not None else ""
        text = (f"export {directory}{who}: {self.records} records in {self.streams} streams, "
                f"{self.digests} digests")  # fmt: skip
        if self.filters:
            shown = ", ".join(f"--{k} {v}" for k, v in self.filters.items())
            text += (f" (filtered: {shown}; what the filter left out is not proved, only "
                     "the manifest says it was)")  # fmt: skip
        return f"{text}: {verdict}"


class _Oversized(ValueError):
    """A file larger than the verifier reads (its message says what to do)."""


def _load(path: Path, limit: int, holds: str) -> Any:
    """``path``'s JSON, read only when it is at most ``limit`` bytes (else
    :class:`_Oversized`: ``holds`` says what a real one holds); a RecursionError (nesting
    too deep) as the ValueError it means. A FIFO or a device (``/dev/zero``) is refused
    before it is read: reading it would wait for a writer, or never end."""
    if path.exists() and not path.is_file():
        raise ValueError(f"{path.name} is not a regular file")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""  # +1: a file that grew is seen
    if size > limit or len(data) > limit:
        raise _Oversized(
            f"{path.name} is {max(size, len(data)):,} bytes, over the verifier's limit of "
            f"{limit:,} ({_mib(limit)}) for it, so it is not read (a real one holds {holds}): "
            "altered, or a genuine export larger than that, which `accord audit verify "
            "--max-json-mib N` (verify_export(..., json_limit=BYTES)) reads"
        )  # fmt: skip
    try:
        return json.loads(data.decode())
    except RecursionError:
        raise ValueError("nested too deep") from None


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


#: The text of an ``ObjectId`` as the export spells it (lowercase: one spelling per id).
_OID = re.compile(r"[0-9a-f]{24}")


def _file_name(name: Any) -> str | None:
    """Why ``name``, a file the manifest lists, is not the name of a file in the export
    (a path elsewhere: ``../x``, ``/dev/zero``); None when it is one."""
    if (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    ):
        return None
    return (f"the manifest's file name {name!r} is not the name of a file in the export "
            "(a path elsewhere, which the export's check does not cover): altered")  # fmt: skip


def _sha(path: Path) -> tuple[str, int]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), size


def verify_export(
    directory: Path,
    *,
    kept: Mapping[str, Any] | None = None,
    pinned: Ed25519PublicKey | None = None,
    audit_period: timedelta | None = None,
    now: datetime | None = None,
    json_limit: int | None = None,
) -> ExportReport:
    """Verify the export in ``directory`` (module docstring). A file of the wrong shape
    (not what the export writes) fails the verification, naming what could not be read.
    Audit cuts are held to ``audit_period`` (default the manifest's ``audit_period_s``)
    at ``now`` (default the clock). ``json_limit`` (bytes) replaces
    :data:`MANIFEST_LIMIT` and :data:`DIGESTS_LIMIT`: a genuine export of more streams or
    digests than they allow (memory: several times it)."""
    report = ExportReport()
    limits = (MANIFEST_LIMIT, DIGESTS_LIMIT) if json_limit is None else (json_limit,) * 2
    try:
        _verify(directory, kept, pinned, report, cut_rules=(audit_period, now), limits=limits)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError,
            OverflowError, OSError) as exc:  # fmt: skip
        report.problems.append(ExportProblem(
            f"the export is malformed, so it cannot be verified ({type(exc).__name__}: {exc})"
        ))  # fmt: skip
    return report


def _verify(
    directory: Path, kept: Mapping[str, Any] | None, pinned: Ed25519PublicKey | None,
    report: ExportReport, cut_rules: tuple[timedelta | None, datetime | None] = (None, None),
    limits: tuple[int, int] | None = None,
) -> None:  # fmt: skip
    add = report.problems.append
    limits = limits or (MANIFEST_LIMIT, DIGESTS_LIMIT)  # (manifest.json, digests.json)
    try:
        manifest = _load(directory / "manifest.json", limits[0],
                         "about 300 bytes per stream and 200 per records file")  # fmt: skip
    except _Oversized as exc:
        add(ExportProblem(str(exc)))
        return
    except (OSError, ValueError) as exc:
        add(ExportProblem(f"no readable manifest.json in {directory}: {exc}"))
        return
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
        add(ExportProblem(f"{directory / 'manifest.json'} is not an accord audit export manifest"))
        return
    if manifest.get("v") != EXPORT_VERSION:  # a format this code cannot vouch for
        add(ExportProblem(f"manifest.json is of export format version {manifest.get('v')!r}, "
                          f"which this verifier does not know (it knows {EXPORT_VERSION})"))  # fmt: skip
        return
    tenant = manifest.get("tenant")
    if not isinstance(tenant, str) or not tenant:
        add(ExportProblem("manifest.json names no tenant"))
        return
    report.tenant = tenant
    report.filters = {k: manifest[k] for k in ("since", "class") if manifest.get(k)}
    _check_manifest_signature(manifest, pinned, add)
    listed = {f.get("name") for f in manifest.get("files", [])}
    listed.add((manifest.get("digests_file") or {}).get("name"))
    for path in sorted(directory.iterdir()):
        if path.name not in listed and path.name not in ("manifest.json", PROGRESS):
            add(ExportProblem(f"file {path.name} is not in the manifest (added)"))
    digests = _check_digests(directory, manifest, tenant, kept, pinned, report, limits[1])
    heads = {s: (seq, h) for s, seq, h in digests[-1].get("heads") or ()} if digests else {}
    checkpoints: dict[str, dict[int, tuple[int, str]]] = {}
    for entry in digests:
        for s, seq, h in entry.get("heads") or ():
            checkpoints.setdefault(s, {})[int(seq)] = (int(entry["digest"]["seq"]), h)
    streams = manifest.get("streams") or {}
    filtered = bool(manifest.get("since") or manifest.get("class"))
    starts: dict[str, tuple[int, str]] = {}
    for s, info in streams.items():
        first = int(info.get("first_seq", 1))
        cut = (manifest.get("cuts") or {}).get(s)
        if cut is not None:  # the stream starts at its audit cut (audit_cuts.py)
            cut_wrong = _cut_problem(cut, first, info)
            if cut_wrong:
                add(ExportProblem(cut_wrong, s, first))
        elif first > 1 and not manifest.get("since"):
            add(ExportProblem("the stream starts after seq 1 in an export without --since",
                              s, 1, expected=1, found=first))  # fmt: skip
        starts[s] = (first - 1, GENESIS if first == 1 else str(info.get("first_prev")))
    checker = ChainChecker(starts, hash_of=read_chain_hash)
    located: dict[str, tuple[int, str | None, str]] = {}  # stream -> (seq, id, location)
    seen: set[str] = set()
    previous: dict[str, tuple[str | None, str]] = {}  # stream -> its last record's (id, where)
    dead: set[str] = set()  # streams found wrong by more than the chain: checked no further
    owned: dict[str, bool] = {}  # stream -> whether its name is the tenant's
    recorded: dict[str, list[tuple[Any, Any, int]]] = {}  # stream -> its cut inserts, seqs
    ids = _IdKeys()
    for location, record, columns, raw in _records(directory, manifest, report.problems):
        report.records += 1
        stream = str(record.get("stream"))
        rid = _record_id(record)
        seq = record.get("seq")
        seen.add(stream)
        if rid is not None:
            ids.add(rid)
        if stream in dead:
            continue
        try:
            wrong = _record_problem(record, raw, stream, tenant, owned)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            wrong = f"the record cannot be checked ({type(exc).__name__}: {exc}): altered"
        if wrong is not None:
            add(ExportProblem(wrong, stream, seq if _is_int(seq) else None, rid, location))
            dead.add(stream)
            continue
        breaks = len(checker.report.breaks)
        checker.feed(record)
        if len(checker.report.breaks) > breaks:
            b = checker.report.breaks[-1]
            problem = b.problem
            if problem == "a record is missing":  # from here on, the seqs skip one or more
                problem = "a record is missing here (removed, or moved out of order)"
            before = previous.get(stream)
            twice = (
                isinstance(b.found, int) and isinstance(b.expected, int) and b.found < b.expected
            )
            if twice and before is not None:  # the one before may be the forgery
                problem += (f"; seq {b.found} appears twice, the other is record "
                                f"{before[0]} at {before[1]} (one of them is inserted)")  # fmt: skip
            add(ExportProblem(problem, stream, b.seq, rid, location, b.expected, b.found))
            continue
        previous[stream] = (rid, location)
        if checker.broken(stream):
            continue
        if columns is not None:
            try:
                shown = columns_of(record, columns["record"])
                differ = [c for c in COLUMNS
                          if str(columns.get(c, "")) != str(shown.get(c, ""))]  # fmt: skip
            except (TypeError, ValueError, AttributeError) as exc:  # a field of the wrong type
                differ = [f"(unreadable: {type(exc).__name__})"]
            if differ:
                add(ExportProblem(f"its {', '.join(differ)} column(s) disagree with the record "
                                  "(altered)", stream, seq, rid, location))  # fmt: skip
                dead.add(stream)
                continue
        if is_cut_record(record):  # where its audit cut is recorded (checked at the end)
            for op in record.get("ops") or ():
                if isinstance(op, Mapping) and op.get("op") == "insert":
                    recorded.setdefault(stream, []).append(
                        (op.get("doc_id"), op.get("image_hash"), int(seq))  # type: ignore[arg-type]
                    )
        mark = checkpoints.get(stream, {}).get(int(seq)) if isinstance(seq, int) else None
        if mark is not None and mark[1] != record.get("hash"):
            add(ExportProblem(f"digest {mark[0]} holds another hash for this seq (the chain "
                              "was rewritten)", stream, seq, rid, location, mark[1],
                              record.get("hash")))  # fmt: skip
            dead.add(stream)
        located[stream] = (int(seq), rid, location)  # type: ignore[arg-type]
    report.streams = len(seen)
    broken = {p.stream for p in report.problems if p.stream is not None}
    repeated = ids.repeated()
    if repeated:  # an _id is outside the hash: only its being unique can be checked
        report.problems.extend(_shared_ids(directory, manifest, repeated, broken))
        broken = {p.stream for p in report.problems if p.stream is not None}
    for stream in sorted(set(heads) | seen):
        if stream in broken:
            continue
        head = heads.get(stream)
        last = checker.last(stream)
        if head is None:
            add(ExportProblem("the stream is not in the covering digest (forged)", stream))
        elif last is None:
            if not filtered:
                add(ExportProblem("the stream's records are missing (the digest holds its "
                                  f"head at seq {head[0]})", stream, 1))  # fmt: skip
        elif last[0] < head[0]:
            add(ExportProblem(f"the records after seq {last[0]} are missing (truncated: the "
                              f"covering digest holds the head at seq {head[0]})", stream,
                              last[0] + 1, expected=head[0], found=last[0]))  # fmt: skip
        elif last != head:
            add(ExportProblem("the stream does not end at the covering digest's head", stream,
                              last[0], None, located.get(stream, (0, None, None))[2], head,
                              last))  # fmt: skip
    broken = {p.stream for p in report.problems if p.stream is not None}
    commits = _commits(digests, manifest.get("cuts") or {})
    for stream, cut in (manifest.get("cuts") or {}).items():
        if stream in broken or stream not in streams:
            continue
        # as verify --live: the cut must be the one the stream's chain recorded, or a cut
        # forged in the manifest would vouch for any records deleted before it
        by = next((seq for i, h, seq in recorded.get(stream, ())
                   if (i, h) == (cut.get("_id"), image_hash(cut))), None)  # fmt: skip
        if by is not None:  # ... and justified by the digests, as verify --live asks
            unjustified = _cut_unjustified(cut, commits.get(stream, []), by, manifest,
                                           cut_rules)  # fmt: skip
            if unjustified:
                add(ExportProblem(unjustified, stream, int(cut["seq"])))
        else:
            add(ExportProblem(
                "the stream's audit cut is not recorded in its exported records (forged in "
                "the manifest, or the covering digest predates the cut's record: take a "
                "digest and export again)", stream, int(streams[stream].get("first_seq", 1)),
                expected=image_hash(cut), found="no record of its insert",
            ))  # fmt: skip
    broken = {p.stream for p in report.problems if p.stream is not None}
    for stream, info in streams.items():
        last = checker.last(stream)
        if stream in broken or last is None:
            continue
        if (info.get("last_seq"), info.get("last_hash")) != last:
            add(ExportProblem("the manifest's range of the stream disagrees with its records",
                              stream, None, expected=(info.get("last_seq"),
                                                      info.get("last_hash")), found=last))  # fmt: skip
    if manifest.get("records") != report.records:
        add(ExportProblem("the manifest's record count disagrees with the files",
                          expected=manifest.get("records"), found=report.records))  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _record_id(record: Mapping[str, Any]) -> str | None:
    rid = record.get("_id")
    found = rid.get("$oid") if isinstance(rid, dict) else None
    return found if isinstance(found, str) else None


def _tenant_of(stream: str) -> Any:
    """The tenant a stream's name says (its first part), or None."""
    try:
        parts = json.loads(stream)
    except (ValueError, RecursionError):
        return None
    return parts[0] if isinstance(parts, list) and parts else None


def _record_problem(
    record: Mapping[str, Any], raw: bytes | str, stream: str, tenant: str, owned: dict[str, bool]
) -> str | None:
    """Why ``record`` (``raw``, its text in the file) is not one of ``tenant``'s records
    as the export writes them, before its chain is checked; None when it is."""
    if owned.setdefault(stream, _tenant_of(stream) == tenant) is False:
        return f"the stream is not of tenant {tenant!r} (another tenant's records)"
    if record.get("tenant_id") != tenant:
        return (f"the record is of tenant {record.get('tenant_id')!r}, not {tenant!r} "
                "(another tenant's records)")  # fmt: skip
    # the export writes each record's RFC 8785 JSON: any other text (a duplicate key,
    # whose value the parser drops, another spelling) says what the hash does not cover
    text = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if canonical_read(record) != text:
        return ("the line is not the record's canonical JSON as the export writes it (a "
                "duplicate key, or another spelling): altered")  # fmt: skip
    rid = record.get("_id")
    if not (isinstance(rid, dict) and len(rid) == 1 and isinstance(rid.get("$oid"), str)
            and _OID.fullmatch(rid["$oid"])):  # fmt: skip
        # the _id is outside the hash, but it is what names the record (a proof, an
        # erasure): every record has an ObjectId, spelled one way
        return "its _id is not an ObjectId, as every record's is: altered"
    return None


class _IdKeys:
    """Every record's ``_id``, kept as the 8 bytes of its ``hash()``, not as a set of the
    ids (about 100 bytes each: 100 MB at a million records); two records whose keys are
    equal are confirmed to share their ``_id``, or not (another id of the same key), by
    a second read of the files (:func:`_shared_ids`), which only an export with such a
    pair pays for. ``hash()`` of a string is keyed per process, so a forger cannot make
    every id collide to make that read hold them all."""

    def __init__(self) -> None:
        self._keys = array("q")

    def add(self, rid: str) -> None:
        self._keys.append(hash(rid))

    def repeated(self) -> set[int]:
        """The keys met more than once."""
        import numpy as np

        keys = np.sort(np.frombuffer(self._keys, dtype=np.int64))
        return set(keys[1:][keys[1:] == keys[:-1]].tolist())


def _shared_ids(
    directory: Path, manifest: Mapping[str, Any], repeated: set[int], broken: set[str]
) -> Iterator[ExportProblem]:
    """A problem for each record whose ``_id`` an earlier record has (the files read
    again; their ``_id`` keys among ``repeated``), but in the streams found ``broken``."""
    first: dict[str, tuple[str, Any, str]] = {}  # _id -> (stream, seq, where) of its first
    for location, record, _, _ in _records(directory, manifest, []):
        rid = _record_id(record)
        if rid is None or hash(rid) not in repeated:
            continue
        stream, seq = str(record.get("stream")), record.get("seq")
        other = first.setdefault(rid, (stream, seq, location))
        if other[2] == location or stream in broken:
            continue
        broken.add(stream)  # each stream named once, at its first problem
        yield ExportProblem(
            f"the record shares its _id with the record at {other[2]} (stream {other[0]}, "
            f"seq {other[1]}): an _id names one record, so one of them is a copy or forged",
            stream, seq if _is_int(seq) else None, rid, location,
        )  # fmt: skip


def _commits(digests: list[dict[str, Any]], cuts: Mapping[str, Any]) -> dict[str, list[Commit]]:
    """Per cut stream, what the export's (verified) digests committed of it: an entry
    that lists the tenant's heads where the stream's moved (one pass over them)."""
    timed = [(int(e["digest"]["seq"]), when(e["digest"].get("at"))) for e in digests]
    counted = [(n, at) for n, at in timed if at is not None]
    changes: dict[str, list[tuple[int, int]]] = {}
    for entry in digests:
        for s, seq, _ in entry.get("heads") or ():
            moved = changes.setdefault(s, []) if s in cuts else None
            if moved is not None and (not moved or moved[-1][1] != int(seq)):
                moved.append((int(entry["digest"]["seq"]), int(seq)))
    return {s: commits_of(c, counted) for s, c in changes.items()}


def _cut_unjustified(
    cut: Mapping[str, Any], commits: list[Commit], by: int, manifest: Mapping[str, Any],
    cut_rules: tuple[timedelta | None, datetime | None],
) -> str | None:  # fmt: skip
    """Why the stream's audit cut (its record at seq ``by``) is not justified by the
    export's digests (:func:`~.audit_cuts.justify_cut`), against the period given,
    else the manifest's ``audit_period_s`` (an export before 2026-12-07 has none: the
    default policy's)."""
    period, now = cut_rules
    if period is None:
        recorded = manifest.get("audit_period_s")
        if recorded is None:
            from accord.governance.loading import default_policy

            period = audit_period(default_policy())
        elif isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
            period = timedelta(seconds=recorded)
        else:
            return f"the manifest's audit_period_s {recorded!r} is no period (altered)"
    if period is None:
        return ("the stream was cut, but no audit period is expected (the default policy "
                "keeps audit records forever): pass the one expected, --audit-period")  # fmt: skip
    return justify_cut(cut, commits, recorded_by=by, now=now or datetime.now(UTC),
                       min_period=period).problem  # fmt: skip


def _cut_problem(cut: Any, first: int, info: Mapping[str, Any]) -> str | None:
    """Why the manifest's audit cut of a stream is not where its records start."""
    if not isinstance(cut, Mapping) or cut.get("cut_hash") != cut_hash(cut):
        return "the stream's audit cut does not hash to its cut_hash (altered)"
    if cut.get("seq") != first - 1 or cut.get("hash") != info.get("first_prev"):
        return (f"the stream's first record (seq {first}) does not follow its audit cut "
                f"(seq {cut.get('seq')})")  # fmt: skip
    return None


def _check_manifest_signature(
    manifest: Mapping[str, Any], pinned: Ed25519PublicKey | None, add: Any
) -> None:
    signature = manifest.get("signature")
    if not signature:
        if pinned is not None:
            add(ExportProblem("the manifest is not signed, and a public key was pinned"))
        return
    from accord.governance.signing import signature_problem

    body = {k: v for k, v in manifest.items() if k != "signature"}
    problem = signature_problem(body, signature, pinned)
    if problem:
        add(ExportProblem(f"manifest.json: {problem}"))


def _check_digests(
    directory: Path, manifest: Mapping[str, Any], tenant: str, kept: Mapping[str, Any] | None,
    pinned: Ed25519PublicKey | None, report: ExportReport, limit: int,
) -> list[dict[str, Any]]:  # fmt: skip
    add = report.problems.append
    info = manifest.get("digests_file") or {}
    wrong = _file_name(info.get("name", "digests.json"))
    if wrong is not None:
        add(ExportProblem(wrong))
        return []
    path = directory / str(info.get("name", "digests.json"))
    try:
        if path.exists() and not path.is_file():  # a FIFO would wait for a writer
            raise ValueError(f"{path.name} is not a regular file (replaced)")
        digests = _load(path, limit, "about 1 KB per digest and, in each that moved the "
                        "tenant's heads, 130 bytes per stream")  # fmt: skip
        sha, _ = _sha(path)
    except _Oversized as exc:
        add(ExportProblem(str(exc)))
        return []
    except (OSError, ValueError) as exc:
        add(ExportProblem(f"the digests file cannot be read: {exc}"))
        return []
    if sha != info.get("sha256"):
        add(ExportProblem(f"file {path.name} does not hash to the manifest's SHA-256 (altered)",
                          expected=info.get("sha256"), found=sha))  # fmt: skip
    report.digests = len(digests)
    prev = GENESIS
    carried: tuple[str, int] | None = None  # (tenant root, streams) of the last listed heads
    proved: set[int] = set()  # the digests at which the export proves the tenant's heads
    for n, entry in enumerate(digests, start=1):
        digest = entry["digest"]
        problem = digest_problem(digest, pinned)
        if problem is None and digest.get("v") != DIGEST_VERSION:
            problem = (f"digest {digest.get('seq')} is of version {digest.get('v')!r}, which "
                       f"this verifier does not know (it knows {DIGEST_VERSION})")  # fmt: skip
        if problem is None and (digest.get("seq") != n or digest.get("prev") != prev):
            problem = f"digest {digest.get('seq')} does not link to digest {n - 1}"
        if problem is None and entry.get("tenant") != tenant:
            problem = (f"digest {n}'s entry is of tenant {entry.get('tenant')!r}, not the "
                       f"manifest's {tenant!r} (another tenant's export)")  # fmt: skip
        held = None
        if problem is None:
            problem, held = _tenant_problem(entry, carried)
        if problem:
            add(ExportProblem(problem))
            return []  # a digest that does not hold proves nothing
        if held is not None:
            proved.add(n)
        if entry.get("heads") is not None:
            carried = held
        prev = digest["hash"]
    if not digests:
        add(ExportProblem(f"file {path.name} holds no digest: nothing proves the records"))
        return []
    if not digests[-1].get("heads"):
        # an export holds at least one stream, which its covering digest must commit to;
        # without heads there the records could all be gone and nothing would say so
        add(ExportProblem(f"the covering digest {digests[-1]['digest'].get('seq')} lists none "
                          f"of the stream heads of tenant {tenant!r} (removed): the export "
                          "cannot be proved complete"))  # fmt: skip
        return []
    covering = manifest.get("digest") or {}
    if digests and (digests[-1]["digest"]["seq"], digests[-1]["digest"]["hash"]) != (
        covering.get("seq"),
        covering.get("hash"),
    ):
        add(ExportProblem("the manifest names another covering digest than digests.json's last",
                          expected=covering, found=digests[-1]["digest"]["seq"]))  # fmt: skip
    if kept is not None:
        mine = next((e["digest"] for e in digests if e["digest"]["seq"] == kept.get("seq")), None)
        if mine is None:
            add(ExportProblem(f"the export does not reach the digest kept (seq {kept.get('seq')}; "
                              f"its last is {len(digests)}): records it covers are missing"))  # fmt: skip
        elif mine["hash"] != kept.get("hash"):
            add(ExportProblem(f"the export's digest {kept.get('seq')} is not the digest kept "
                              "(the export's digests were rewritten)", expected=kept.get("hash"),
                              found=mine["hash"]))  # fmt: skip
            return []
        elif mine["seq"] not in proved:
            # the digests after the one kept may be forged (unless a key is pinned): what
            # the kept one commits to must be proved, or a rewritten history passes
            add(ExportProblem(
                f"digest {mine['seq']}, the digest kept, proves none of tenant {tenant!r}'s "
                "stream heads in this export: its entry lists none and has no audit path to "
                "them (removed; or the digest predates the tenant's streams, or the export "
                "predates 2026-12-07), so it proves none of the records: verify against a "
                "later digest, or export again"
            ))  # fmt: skip
            return []
    return list(digests)


def _tenant_problem(
    entry: Mapping[str, Any], carried: tuple[str, int] | None
) -> tuple[str | None, tuple[str, int] | None]:
    """Why ``entry``'s heads of the tenant do not rebuild its digest's root (None when
    they do), and the (tenant root, streams) it proves at that digest (None when it
    proves none). An entry that lists no heads (``null``: they did not move) proves
    ``carried``, the last listed ones, through its audit path; one without a path
    (an export written before 2026-12-07, or before the tenant's first stream) or
    without heads listed before it is there for its link only, and proves nothing."""
    digest = entry["digest"]
    listed = entry.get("heads")
    if listed is None:
        if entry.get("tenant_path") is None or carried is None:
            return None, None  # nothing to prove (a covering or kept digest must prove)
        tenant_root, streams = carried
    else:
        heads = [(str(s), int(seq), str(h)) for s, seq, h in listed]
        if not heads:
            return None, None  # the tenant had no stream yet at this digest
        tenant_root, streams = tenant_root_from(heads), len(heads)
    leaf = tenant_leaf(str(entry["tenant"]), tenant_root, streams)
    found = root_via(int(entry["tenant_index"]), int(entry["tenants"]), leaf, entry["tenant_path"])
    if found != digest["root"]:
        return (f"digest {digest['seq']}: the tenant's stream heads in the export do not "
                f"rebuild its Merkle root (heads altered, removed or added)"), None  # fmt: skip
    return None, (tenant_root, streams)


#: One (file:line, record, its CSV/Parquet columns or None, its text as in the file).
Row = tuple[str, dict[str, Any], dict[str, Any] | None, bytes | str]

#: The longest JSONL line (bytes) or CSV row (characters) read (since 2026-12-07; it was
#: 1 GiB): a record is a document of at most 16 MiB, whose images (at most 8 MiB of JSON
#: text) are escaped once more in its JSON, so its line is at most about 32 MiB. A longer
#: one is named and dropped as it is read: held to the limit, never past it, and never
#: joined or parsed. (A Parquet record is bounded by its row group's bytes.)
LINE_LIMIT = 64 << 20
#: The largest CSV field csv reads (csv's default is 128 KiB); each row is held to
#: :data:`LINE_LIMIT` before csv sees it.
CSV_FIELD_LIMIT = LINE_LIMIT


def _records(
    directory: Path, manifest: Mapping[str, Any], problems: list[ExportProblem]
) -> Iterator[Row]:
    """Every record of every records file the manifest lists, in order; files that do not
    hash to the manifest are named (before what their records say), and still read (the
    records say which one changed). A JSONL file is hashed as it is read: one pass. A
    file that cannot be read (not a file, corrupt) is named, and the others still read."""
    add = problems.append
    for info in manifest.get("files", []):
        wrong = _file_name(info.get("name"))
        if wrong is not None:
            add(ExportProblem(wrong))
            continue
        path = directory / str(info.get("name"))
        if not path.exists():
            add(ExportProblem(f"file {path.name} is missing (removed)"))
            continue
        if not path.is_file():
            add(ExportProblem(f"file {path.name} is not a regular file (replaced)"))
            continue
        at = len(problems)
        try:
            if path.suffix == ".jsonl":
                hashed = hashlib.sha256()
                size = yield from _jsonl(path, hashed, add)
                found = hashed.hexdigest()
            else:
                found, size = _sha(path)
        except OSError as exc:
            add(ExportProblem(f"file {path.name} cannot be read ({exc.strerror or exc})"))
            continue
        if found != info.get("sha256") or size != info.get("bytes"):
            problems.insert(at, ExportProblem(
                f"file {path.name} does not hash to the manifest's SHA-256 (altered)",
                expected=info.get("sha256"), found=found,
            ))  # fmt: skip
        if path.suffix != ".jsonl":
            yield from _read(path, add)


def _jsonl(path: Path, hashed: Any, add: Any) -> Generator[Row, None, int]:
    """The records of a JSONL file, read in large blocks that are hashed (``hashed``) as
    they are split into lines; returns the file's size. A line longer than
    :data:`LINE_LIMIT` is named, not held."""
    name, n, size = path.name, 0, 0
    with open(path, "rb") as f:
        for line in _lines(f, hashed):
            n += 1
            where = f"{name}:line {n}"
            if line is None:
                add(ExportProblem(_too_long("line", "bytes"), location=where))
                continue
            record = _parse(line.decode("utf-8", "replace"), where, add)
            if record is not None:
                yield where, record, None, line
        size = f.tell()
    return size


def _too_long(what: str, unit: str) -> str:
    return (f"the {what} is longer than {LINE_LIMIT:,} {unit} ({_mib(LINE_LIMIT)}, the "
            "verifier's limit), longer than any record's JSON (at most about 32 MiB): "
            "altered; not read")  # fmt: skip


def _lines(f: Any, hashed: Any) -> Iterator[bytes | None]:
    """The lines of ``f`` (without their newline), read in blocks of 4 MiB that are hashed
    as they are read; None for a line longer than :data:`LINE_LIMIT`. A line spanning
    blocks is kept as a list of its pieces, joined once at its end (joining at each block
    copied it again per block: a line of n blocks cost n^2/2 blocks of copying)."""
    pieces: list[bytes] = []  # the unfinished line
    held, over = 0, False  # its length so far; whether it is past the limit (then dropped)
    while block := f.read(1 << 22):
        hashed.update(block)
        lines = block.split(b"\n")
        rest = lines.pop()  # after the block's last newline: the start of the next line
        if lines and (pieces or over):  # the first line ends one begun in earlier blocks
            end = lines.pop(0)
            yield None if over or held + len(end) > LINE_LIMIT else b"".join([*pieces, end])
            pieces, held, over = [], 0, False
        if max(map(len, lines), default=0) <= LINE_LIMIT:  # the usual case, in C
            yield from lines
        else:
            yield from (line if len(line) <= LINE_LIMIT else None for line in lines)
        if rest and not over:
            held += len(rest)
            over = held > LINE_LIMIT
            if over:
                pieces = []
            else:
                pieces.append(rest)
    if pieces or over:  # the last line, without its newline
        yield None if over else b"".join(pieces)


def _double_constant(name: str) -> Double:
    return Double(float(name))  # NaN, Infinity, -Infinity: doubles too


#: ``json.loads`` with doubles marked (:class:`~accord.governance.canonical.Double`),
#: made once (``json.loads`` with arguments makes a decoder per call).
_DECODER = json.JSONDecoder(parse_float=Double, parse_constant=_double_constant)
_SCAN: Any = make_scanner(_DECODER)  # type: ignore[arg-type]  # its context: a decoder


def _parse(text: str, location: str, add: Any) -> dict[str, Any] | None:
    try:
        try:  # the common case (an object, then the newline) without decode()'s regexes
            record, end = _SCAN(text, 0)
        except StopIteration:
            record = _DECODER.decode(text)  # raises what json.loads raises
        else:
            if text[end:].strip(" \t\n\r"):
                record = _DECODER.decode(text)
    except ValueError as exc:
        add(ExportProblem(f"the record is not JSON ({exc}): altered", location=location))
        return None
    except RecursionError:  # nested deeper than any record
        add(ExportProblem("the record is not JSON (nested too deep): altered", location=location))
        return None
    if not isinstance(record, dict):
        add(ExportProblem("the record is not a JSON object: altered", location=location))
        return None
    return record


def _read(path: Path, add: Any) -> Iterator[Row]:
    """The records of a CSV or Parquet file; a file that cannot be read on is named where
    it stops (its other records were read)."""
    if path.suffix == ".parquet":
        yield from _parquet(path, add)
        return
    if path.suffix != ".csv":
        add(ExportProblem(f"file {path.name} is not a records file (.jsonl, .csv, .parquet)"))
        return
    # the process-wide limit, only ever raised: a record is far larger than csv's default
    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        lines = _RowLines(f)
        reader = csv.DictReader(lines)
        while True:
            lines.held = 0  # each row (its lines together) to the limit
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                add(ExportProblem(f"file {path.name} cannot be read on ({exc}): altered",
                                  location=f"{path.name}:line {reader.line_num}"))  # fmt: skip
                return
            except _RowTooLong:  # where the next row starts is lost with it: stop there
                add(ExportProblem(f"{_too_long('row', 'characters')}; the file is read no further",
                                  location=f"{path.name}:line {reader.line_num + 1}"))  # fmt: skip
                return
            where = f"{path.name}:line {reader.line_num}"
            text = row.get("record") or ""
            if not isinstance(text, str):  # more fields than the header: a list
                text = ""
            record = _parse(text, where, add)
            if record is not None:
                yield where, record, row, text


class _RowTooLong(Exception):
    """A CSV row longer than :data:`LINE_LIMIT` (raised through csv's reader)."""


class _RowLines:
    """The lines of a text file for :mod:`csv`, each read to at most what is left of
    :data:`LINE_LIMIT` for its row (``held``, reset per row by the reader's caller): a
    line or a row past it raises :class:`_RowTooLong` before more of it is read (csv
    itself reads a line whole, and a quoted field goes on over lines)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.held = 0

    def __iter__(self) -> _RowLines:
        return self

    def __next__(self) -> str:
        line = self._f.readline(LINE_LIMIT + 1 - self.held)
        if not line:
            raise StopIteration
        self.held += len(line)
        if self.held > LINE_LIMIT:
            raise _RowTooLong
        return str(line)


def _footer_problem(path: Path) -> str | None:
    """Why ``path``'s Parquet footer is not read (None when it may be): longer than
    :data:`PARQUET_FOOTER_LIMIT`, or than the file. A file without Parquet's magic is
    left to pyarrow, which says so."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 12:
            return None
        f.seek(size - 8)
        tail = f.read(8)
    if tail[4:] != b"PAR1":
        return None
    length = int.from_bytes(tail[:4], "little")
    if length > min(PARQUET_FOOTER_LIMIT, size - 12):
        return (f"its footer (metadata) is {length:,} bytes, over the verifier's limit of "
                f"{PARQUET_FOOTER_LIMIT:,} ({_mib(PARQUET_FOOTER_LIMIT)}) or the file's size "
                "(a real one is some 80 KB per 100,000 records), so it is not read")  # fmt: skip
    return None


def _row_group_problem(group: Any) -> str | None:
    """Why a row group (its metadata) is not read (None when it may be): more rows than
    :data:`ROW_GROUP_ROWS`, or more bytes than :data:`ROW_GROUP_BYTES` (its data, or any
    column chunk, uncompressed or compressed)."""
    if not 0 <= group.num_rows <= ROW_GROUP_ROWS:
        return (f"holds {group.num_rows:,} rows, over the verifier's limit of "
                f"{ROW_GROUP_ROWS:,} (the export writes at most 5,000)")  # fmt: skip
    chunks = [group.column(j) for j in range(group.num_columns)]
    sizes = {
        "its data uncompressed": _group_bytes(group),
        "its data compressed": sum(c.total_compressed_size for c in chunks),
        **{f"column {c.path_in_schema}": max(c.total_uncompressed_size, c.total_compressed_size)
           for c in chunks},
    }  # fmt: skip
    for what, size in sizes.items():
        if not 0 <= size <= ROW_GROUP_BYTES:
            return (f"holds {size:,} bytes ({what}), over the verifier's limit of "
                    f"{ROW_GROUP_BYTES:,} ({_mib(ROW_GROUP_BYTES)}; the export ends a row "
                    "group at 32 MiB of records, and one before 2026-12-07 at 5,000 rows)")  # fmt: skip
    return None


def _group_bytes(group: Any) -> int:
    """A row group's bytes uncompressed, as its metadata says (the larger of its total
    and its column chunks' sum: either may be the one a forger made small)."""
    chunks = (group.column(j).total_uncompressed_size for j in range(group.num_columns))
    return max(group.total_byte_size, sum(chunks))


def _batch_rows(group: Any) -> int:
    """How many of a row group's rows to read at once: about :data:`BATCH_BYTES` by its
    average row (its metadata's), at most 2,000 (a record is usually 1 KB), at least 1."""
    return max(1, min(2_000, BATCH_BYTES * max(group.num_rows, 1) // max(_group_bytes(group), 1)))


def _parquet(path: Path, add: Any) -> Iterator[Row]:
    """The rows of a Parquet file, row group by row group, each group's metadata checked
    before it is read (:func:`_row_group_problem`), then each of its column chunks' page
    headers (:func:`~accord.governance.parquet_pages.chunk_problem`); the file is read
    through a 1 MiB buffer (pyarrow's default reads a column chunk whole), a string
    column whose chunks declare a dictionary as one (:func:`_parquet_rows` decodes a
    batch a slice at a time)."""
    _, pq = pyarrow_modules()
    wrong = _footer_problem(path)
    if wrong is not None:
        add(ExportProblem(f"file {path.name} is not read: {wrong}: altered"))
        return
    try:
        meta = pq.ParquetFile(str(path), buffer_size=1 << 20).metadata
        # Only a dictionary repeats a value without its bytes (DELTA_BYTE_ARRAY is refused,
        # chunk_problem holds each chunk to its declared dictionary): those columns are read
        # as dictionaries. The others are read plain, so pyarrow need not hash every value
        # of a row group into a dictionary (an export's unique columns: +55 MiB at 1M).
        declared = {meta.row_group(n).column(j).path_in_schema
                    for n in range(meta.num_row_groups)
                    for j in range(meta.num_columns)
                    if meta.row_group(n).column(j).has_dictionary_page}  # fmt: skip
        strings = [meta.schema.column(j).path for j in range(meta.num_columns)
                   if meta.schema.column(j).physical_type == "BYTE_ARRAY"
                   and meta.schema.column(j).path in declared]  # fmt: skip
        parquet = pq.ParquetFile(str(path), buffer_size=1 << 20, metadata=meta,
                                 read_dictionary=strings)  # fmt: skip
        wrong = _schema_problem(parquet.schema_arrow)
    except (OSError, ValueError) as exc:  # pyarrow's errors: ArrowInvalid is a ValueError
        add(ExportProblem(f"file {path.name} is not a readable Parquet file ({exc}): altered"))
        return
    if wrong is not None:
        add(ExportProblem(f"file {path.name} is not read: {wrong}: altered"))
        return
    data_end = path.stat().st_size - 8 - meta.serialized_size  # where the footer starts
    line = 0
    with open(path, "rb", buffering=0) as raw:
        for n in range(meta.num_row_groups):
            group = meta.row_group(n)
            wrong = _row_group_problem(group)
            if wrong is not None:
                wrong += ", so it and the rest of the file are not read: altered, or written "
                wrong += "by an export before 2026-12-07 (export again)"
            for j in range(group.num_columns if wrong is None else 0):
                chunk = group.column(j)
                pages = chunk_problem(raw, chunk, group.num_rows, data_end)
                if pages is not None:
                    wrong = (f"column {chunk.path_in_schema!r}: {pages}, so it and the rest of "
                             "the file are not read: altered")  # fmt: skip
                    break
            if wrong is not None:
                add(ExportProblem(f"file {path.name}'s row group {n} {wrong}",
                                  location=f"{path.name}:row {line + 1}"))  # fmt: skip
                return
            batches = parquet.iter_batches(batch_size=_batch_rows(group), row_groups=[n])
            line = yield from _parquet_rows(path.name, batches, line, add)
            if line < 0:  # a corrupt page: the rest cannot be read
                return


def _schema_problem(schema: Any) -> str | None:
    """Why a Parquet file of the (pyarrow) ``schema`` it is read as is not read (None
    when it may be): a column read as anything but strings or bytes (its strings,
    :data:`~accord.governance.export.COLUMNS`; a dictionary of them where its chunks
    declare one), or a number (``seq``). Another
    type (a list, a JSON extension, fixed-size bytes) could hold a value repeated in
    every row, decoded in each, which the export never writes."""
    pa, _ = pyarrow_modules()
    for f in schema:
        t = f.type
        value = t.value_type if pa.types.is_dictionary(t) else t
        strings = any(is_(value) for is_ in (pa.types.is_string, pa.types.is_binary,
                                             pa.types.is_large_string,
                                             pa.types.is_large_binary))  # fmt: skip
        if not (strings or pa.types.is_integer(t) or pa.types.is_floating(t)
                or pa.types.is_boolean(t)):  # fmt: skip
            return (f"its column {f.name!r} is of type {t}, which the export never writes "
                    "(strings, and an int64)")  # fmt: skip
    return None


def _value_bytes(column: Any) -> Any:
    """Each row's bytes in a dictionary ``column`` decoded (int64; null for a null), from
    its dictionary's offsets: the size of the batch decoded, without decoding it."""
    pa, _ = pyarrow_modules()
    import pyarrow.compute as pc

    values, rows = column.dictionary, column.indices
    large = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    offsets = pa.Array.from_buffers(pa.int64() if large else pa.int32(), len(values) + 1,
                                    [None, values.buffers()[1]], offset=values.offset)  # fmt: skip
    ends = pc.take(offsets, pc.add(rows.cast(pa.int64()), 1))
    return pc.subtract(ends, pc.take(offsets, rows)).cast(pa.int64())


def _slices(batch: Any) -> list[tuple[int, int]]:
    """``batch`` cut in slices (start, length) of about :data:`BATCH_BYTES` decoded (at
    least one row): a dictionary column may repeat one long value in every row (a few
    bits a row in the file), and decoding the batch whole would hold every copy."""
    pa, _ = pyarrow_modules()
    import pyarrow.compute as pc

    bound = 0  # the batch decoded, at most: each dictionary's longest value in every row
    for column in batch.columns:
        if pa.types.is_dictionary(column.type):
            longest = pc.max(pc.binary_length(column.dictionary)).as_py() or 0
            bound += longest * (len(column) - column.null_count)
        else:
            bound += column.nbytes
    if bound <= BATCH_BYTES:  # the usual case: the batch as it is
        return [(0, batch.num_rows)]
    sizes = [_value_bytes(c).fill_null(0) for c in batch.columns if pa.types.is_dictionary(c.type)]
    if not sizes:  # numbers only: a few bytes a row
        return [(0, batch.num_rows)]
    rows = sizes[0]  # each row's bytes decoded
    for each in sizes[1:]:
        rows = pc.add(rows, each)
    cuts, start, held = [], 0, 0
    for i, size in enumerate(rows.to_pylist()):
        if i > start and held + size > BATCH_BYTES:
            cuts.append((start, i - start))
            start, held = i, 0
        held += size
    cuts.append((start, batch.num_rows - start))
    return cuts


def _decoded(batch: Any) -> dict[str, list[Any]]:
    """``batch``'s columns as lists (its dictionary columns decoded)."""
    pa, _ = pyarrow_modules()
    return {name: (column.dictionary_decode() if pa.types.is_dictionary(column.type)
                   else column).to_pylist()
            for name, column in zip(batch.schema.names, batch.columns, strict=True)}  # fmt: skip


def _parquet_rows(
    name: str, batches: Iterator[Any], line: int, add: Any
) -> Generator[Row, None, int]:
    """The rows of one row group's ``batches`` (after row ``line`` of the file), each
    decoded in slices of about :data:`BATCH_BYTES` (:func:`_slices`); returns the last
    row's number, or -1 when a batch cannot be read (named)."""
    while True:
        try:
            batch = next(batches)
            parts = _slices(batch)
        except StopIteration:
            return line
        except (OSError, ValueError, IndexError) as exc:  # a corrupt page: the rest cannot be read
            add(ExportProblem(f"file {name} cannot be read past row {line} ({exc}): "
                              "altered", location=f"{name}:row {line + 1}"))  # fmt: skip
            return -1
        for start, length in parts:
            try:
                columns = _decoded(batch.slice(start, length))
            except (ValueError, IndexError) as exc:  # an index past its dictionary
                add(ExportProblem(f"file {name} cannot be read past row {line} "
                                  f"({exc}): altered", location=f"{name}:row {line + 1}"))  # fmt: skip
                return -1
            names = list(columns)
            for values in zip(*columns.values(), strict=True):
                row = dict(zip(names, values, strict=True))
                line += 1
                where = f"{name}:row {line}"
                text = str(row.get("record"))
                record = _parse(text, where, add)
                if record is not None:
                    yield where, record, row, text
