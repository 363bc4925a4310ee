"""The offline verifier reads an export an attacker may have made with bounded memory
(since 2026-12-07; docs/governance.md, "Verifying an export, without the database"):
``manifest.json`` and ``digests.json`` past their limits are refused before they are
read, a JSONL line or CSV row past :data:`~export_verify.LINE_LIMIT` is named and
dropped as it is read, and a Parquet file's footer and row groups are checked against
their limits before they are read. Each is the verifier's usual failure (exit 1, in
text and ``--json``), not a traceback; a normal export still verifies.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from accord.governance import export as export_module
from accord.governance import export_verify, parquet_pages
from accord.governance.export_verify import verify_export
from tests.governance.test_audit_verify_tamper import _cli, _export, trail
from tests.governance.test_audit_verify_tamper_2 import _recompute_manifest_bytes

__all__ = ["trail"]  # the fixture, imported for pytest

GIB = 1 << 30


def _problems(out: Path, **kwargs: Any) -> list[str]:
    return [p.describe() for p in verify_export(out, **kwargs).problems]


def _fails_clearly(out: Path, words: str) -> None:
    """``accord audit verify`` exits 1 naming ``words``, in text and in ``--json``."""
    text = _cli("verify", str(out))
    assert text.exit_code == 1, text.output
    assert words in " ".join(text.output.split()), text.output
    assert "Traceback" not in text.output
    as_json = _cli("verify", str(out), "--json")
    assert as_json.exit_code == 1, as_json.output
    report = json.loads(as_json.output)
    assert not report["ok"]
    assert any(words in p["problem"] for p in report["problems"]), report


def _grow(path: Path, size: int) -> None:
    """``path`` made ``size`` bytes (NULs after its text: a sparse file, no disk used)."""
    with open(path, "r+b") as f:
        f.truncate(size)


# --- a normal export -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_a_normal_export_still_verifies(trail: dict[str, Any], tmp_path: Path, fmt: str) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="parquet needs the 'export' extra (pyarrow)")
    out = _export(trail, tmp_path / "x", fmt=fmt)
    report = verify_export(out, kept=trail["digest"])
    assert report.ok and report.records > 0, report.as_dict()
    result = _cli("verify", str(out))
    assert result.exit_code == 0, result.output


# --- manifest.json and digests.json --------------------------------------------------------


def test_a_manifest_of_gigabytes_is_refused_unread(trail: dict[str, Any], tmp_path: Path) -> None:
    out = _export(trail, tmp_path / "x")
    _grow(out / "manifest.json", 3 * GIB)
    problems = _problems(out)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"manifest.json is {3 * GIB:,} bytes, over the verifier's "
                                  f"limit of {export_verify.MANIFEST_LIMIT:,}"), problems  # fmt: skip
    assert "--max-json-mib" in problems[0]  # what to do with a genuine one
    _fails_clearly(out, f"manifest.json is {3 * GIB:,} bytes")


def test_a_digests_file_of_gigabytes_is_refused_unread(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    out = _export(trail, tmp_path / "x")
    _grow(out / "digests.json", 2 * GIB)
    problems = _problems(out)
    assert any(p.startswith(f"digests.json is {2 * GIB:,} bytes, over the verifier's limit of "
                            f"{export_verify.DIGESTS_LIMIT:,}") for p in problems), problems  # fmt: skip
    _fails_clearly(out, f"digests.json is {2 * GIB:,} bytes")


def test_json_limit_reads_a_genuine_export_past_the_default(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    out = _export(trail, tmp_path / "x")
    size = (out / "manifest.json").stat().st_size
    assert any("over the verifier's limit of 100 " in p
               for p in _problems(out, json_limit=100)), size  # fmt: skip
    assert verify_export(out, json_limit=size + (out / "digests.json").stat().st_size).ok
    # the CLI's flag: a limit past the default reads it, a bad one is a usage error
    _grow(out / "manifest.json", export_verify.MANIFEST_LIMIT + 1)
    assert _cli("verify", str(out)).exit_code == 1
    grown = _cli("verify", str(out), "--max-json-mib", "17")
    assert "over the verifier's limit" not in grown.output, grown.output
    assert _cli("verify", str(out), "--max-json-mib", "0").exit_code == 2


# --- JSONL lines and CSV rows --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "filler", "said", "factor"),
    [
        # held to the limit, then dropped: never joined, decoded or parsed (the old reader
        # held all 65 MiB, joined it, decoded it: some 200 MiB)
        ("jsonl", b"x", "line 8: the line is longer than 67,108,864 bytes", 3 / 2),
        # the limit's, not the row's (csv would have held it 4 bytes a character: 260 MiB)
        ("csv", b"y", "line 9: the row is longer than 67,108,864 characters", 5 / 2),
    ],
)
def test_a_line_past_the_limit_is_named_without_holding_it(
    trail: dict[str, Any], tmp_path: Path, fmt: str, filler: bytes, said: str, factor: float
) -> None:
    """A line (JSONL) or row (CSV) of 65 MiB: the old limit, 1 GiB, held it whole."""
    out = _export(trail, tmp_path / "x", fmt=fmt)
    path = out / f"records-00001.{fmt}"
    with open(path, "ab") as f:
        f.write(filler * (export_verify.LINE_LIMIT + (1 << 20)) + b"\n")
    _recompute_manifest_bytes(out)
    tracemalloc.start()
    try:
        problems = _problems(out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert any(f"{path.name}:{said}" in p for p in problems), problems
    assert peak < export_verify.LINE_LIMIT * factor, peak
    _fails_clearly(out, said.split(": ", 1)[1])


def test_a_csv_row_of_many_short_lines_is_held_to_the_limit(
    trail: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quoted field goes on over lines: the limit is the row's, not each line's."""
    out = _export(trail, tmp_path / "x", fmt="csv")
    monkeypatch.setattr(export_verify, "LINE_LIMIT", 1 << 16)
    path = out / "records-00000.csv"
    with open(path, "ab") as f:
        f.write(b'"' + b"z" * 100 + b"\n" + (b"z" * 100 + b"\n") * 2000 + b'"\n')
    _recompute_manifest_bytes(out)
    problems = _problems(out)
    assert any("records-00000.csv:line 9: the row is longer than 65,536 characters" in p
               for p in problems), problems  # fmt: skip


# --- Parquet -------------------------------------------------------------------------------


def _parquet_export(trail: dict[str, Any], out: Path) -> Path:
    pytest.importorskip("pyarrow", reason="parquet needs the 'export' extra (pyarrow)")
    return _export(trail, out, fmt="parquet")


def _one_row_group(path: Path) -> int:
    """``path`` rewritten as one row group (as a forger's writer may); its rows."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=1 << 30, compression="zstd")
    return int(table.num_rows)


def test_a_parquet_row_group_of_too_many_rows_is_not_read(
    trail: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _parquet_export(trail, tmp_path / "x")
    rows = _one_row_group(out / "records-00000.parquet")
    _recompute_manifest_bytes(out)
    monkeypatch.setattr(export_verify, "ROW_GROUP_ROWS", rows - 1)
    problems = _problems(out)
    assert any(f"records-00000.parquet:row 1: file records-00000.parquet's row group 0 holds "
               f"{rows:,} rows, over the verifier's limit of {rows - 1:,}" in p
               for p in problems), problems  # fmt: skip
    assert not any("records-00000.parquet:row 2" in p for p in problems), problems


def test_a_parquet_row_group_of_too_many_bytes_is_not_read(
    trail: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row group's bytes (uncompressed and compressed) and each column chunk's are
    checked from the metadata before a byte of the group is read."""
    import pyarrow.parquet as pq

    out = _parquet_export(trail, tmp_path / "x")
    path = out / "records-00000.parquet"
    _one_row_group(path)
    _recompute_manifest_bytes(out)
    group = pq.ParquetFile(path).metadata.row_group(0)
    biggest = max(group.column(j).total_uncompressed_size for j in range(group.num_columns))
    monkeypatch.setattr(export_verify, "ROW_GROUP_BYTES", biggest - 1)  # one chunk past it
    read: list[Any] = []

    def iter_batches(*args: Any, **kwargs: Any) -> Any:
        read.append(args)
        return iter(())

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    problems = _problems(out)
    assert any("file records-00000.parquet's row group 0 holds" in p
               and f"over the verifier's limit of {biggest - 1:,}" in p for p in problems), problems  # fmt: skip
    assert read == [], "the row group was read"
    monkeypatch.undo()  # the CLI, in text and --json
    monkeypatch.setattr(export_verify, "ROW_GROUP_BYTES", biggest - 1)
    _fails_clearly(out, "row group 0 holds")


def test_a_parquet_footer_past_the_limit_is_not_read(
    trail: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _parquet_export(trail, tmp_path / "x")
    path = out / "records-00000.parquet"
    footer = int.from_bytes(path.read_bytes()[-8:-4], "little")
    monkeypatch.setattr(export_verify, "PARQUET_FOOTER_LIMIT", footer - 1)
    problems = _problems(out)
    assert any(f"file records-00000.parquet is not read: its footer (metadata) is {footer:,} "
               "bytes, over the verifier's limit" in p for p in problems), problems  # fmt: skip
    monkeypatch.undo()
    data = bytearray(path.read_bytes())
    data[-8:-4] = (3 * GIB).to_bytes(4, "little")  # a footer said to be 3 GiB
    path.write_bytes(bytes(data))
    _recompute_manifest_bytes(out)
    _fails_clearly(out, f"its footer (metadata) is {3 * GIB:,} bytes")


def test_the_export_ends_a_row_group_at_its_byte_bound(
    trail: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records larger than the bound: one row group each, and the export verifies."""
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(export_module, "ROW_GROUP_BYTES", 1)
    out = _export(trail, tmp_path / "x", fmt="parquet")
    meta = pq.ParquetFile(out / "records-00000.parquet").metadata
    assert meta.num_row_groups == meta.num_rows > 1
    assert verify_export(out, kept=trail["digest"]).ok


def test_the_bounds_are_what_a_real_export_is_far_below() -> None:
    """The limits as documented (docs/governance.md names them)."""
    assert export_verify.MANIFEST_LIMIT == 16 << 20
    assert export_verify.DIGESTS_LIMIT == 64 << 20
    assert export_verify.LINE_LIMIT == 64 << 20
    assert export_verify.ROW_GROUP_BYTES >= 4 * export_module.ROW_GROUP_BYTES
    assert export_verify.ROW_GROUP_ROWS >= export_module.ROW_GROUP_ROWS


# --- Parquet pages and dictionaries ----------------------------------------------------------


def _chunk(path: Path, column: str, group: int = 0) -> Any:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata.row_group(group)
    return next(meta.column(j) for j in range(meta.num_columns)
                if meta.column(j).path_in_schema == column)  # fmt: skip


def _pages(path: Path, column: str) -> list[tuple[int, parquet_pages.PageHeader]]:
    """(where it starts, its header) for each page of ``column``'s chunk in row group 0."""
    chunk = _chunk(path, column)
    data = path.read_bytes()
    at = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    end, pages = at + chunk.total_compressed_size, []
    while at < end:
        header = parquet_pages.read_page_header(data[at : at + parquet_pages.PAGE_HEADER_LIMIT])
        pages.append((at, header))
        at += header.length + header.compressed_page_size
    return pages


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _i32(value: int) -> bytes:
    """A Thrift compact i32 field, its id the one after the last (delta 1)."""
    return bytes([0x15]) + _varint((value << 1) ^ (value >> 31))


def _forge_header(path: Path, at: int, header: parquet_pages.PageHeader, **claims: int) -> None:
    """The page header at byte ``at`` of ``path`` rewritten in place, of the same length,
    with ``claims`` (uncompressed_page_size, compressed_page_size, num_values, encoding) instead of
    its own: a data page (v1) or dictionary page header, then an unknown field as
    padding (Thrift readers skip it)."""
    sizes = [claims.get(k, getattr(header, k)) for k in
             ("uncompressed_page_size", "compressed_page_size")]  # fmt: skip
    num_values = claims.get("num_values", header.num_values)
    encoding = claims.get("encoding", header.encoding)
    assert num_values is not None and encoding is not None
    sub = _i32(num_values) + _i32(encoding)
    if header.type == parquet_pages.DATA_PAGE:
        sub += _i32(3) + _i32(3)  # its levels: RLE
    sub_id = {parquet_pages.DATA_PAGE: 5, parquet_pages.DICTIONARY_PAGE: 7}[header.type]
    body = _i32(header.type) + _i32(sizes[0]) + _i32(sizes[1])
    body += bytes([((sub_id - 3) << 4) | 12]) + sub + b"\x00"
    room = header.length - len(body) - 1  # the stop ends it
    if room == 1:  # no room for a field: its type's varint one byte longer (0x80 0x00: 0)
        body = body[:1] + bytes([body[1] | 0x80, 0]) + body[2:]
    elif room > 1:
        pad = next(n for n in range(room - 1, -1, -1) if n + len(_varint(n)) + 1 <= room)
        body += bytes([((15 - sub_id) << 4) | 8]) + _varint(pad) + b"\x00" * pad
    forged = body + b"\x00" * (header.length - len(body))  # the stop (and, past it, zeros)
    assert len(forged) == header.length
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(forged)


class _Pool:
    """pyarrow's allocations while it is entered: ``peak`` is the most it held at once.
    Arrays are allocated from the default pool (a proxy of it is made the default, and
    counts them apart); a Parquet reader's pages from the pool that was the default when
    pyarrow started (its peak, when it rose, less what it held at the start)."""

    def __enter__(self) -> _Pool:
        import pyarrow as pa

        self._pa, self._was = pa, pa.default_memory_pool()
        self._before = (self._was.max_memory(), self._was.bytes_allocated())
        self._pool = pa.proxy_memory_pool(self._was)
        pa.set_memory_pool(self._pool)
        return self

    def __exit__(self, *exc: object) -> None:
        self._pa.set_memory_pool(self._was)

    @property
    def peak(self) -> int:
        pages = self._was.max_memory()
        pages = pages - self._before[1] if pages > self._before[0] else 0
        return max(int(self._pool.max_memory()), pages)


@pytest.mark.parametrize(
    ("column", "page", "claims", "said"),
    [
        # pyarrow allocated the 2 GiB the header claims, to decompress the page into
        (
            "record",
            0,
            {"uncompressed_page_size": 2 * GIB - 1},
            "its header claims 2,147,483,647 bytes uncompressed, more than the column chunk's",
        ),
        (
            "record",
            0,
            {"compressed_page_size": GIB},
            "its header claims 1,073,741,824 bytes (compressed), past the column chunk's end",
        ),
        # a dictionary of more values than its bytes hold (pyarrow sizes it by the claim)
        ("stream", 0, {"num_values": 8_191}, "its dictionary claims 8,191 values, more than its"),
        (
            "record",
            0,
            {"num_values": 1 << 30},
            "its header claims 1,073,741,824 values, past the row group's",
        ),
        # values said to index a dictionary, in a chunk without one (the verifier reads
        # such a column plain: a dictionary page is only read where the metadata says)
        ("record", 0, {"encoding": 8}, "its values index a dictionary the column chunk has not"),
    ],
)
def test_a_parquet_page_header_claiming_more_than_its_chunk_is_refused(
    trail: dict[str, Any], tmp_path: Path, column: str, page: int, claims: dict[str, int],
    said: str,
) -> None:  # fmt: skip
    """Each column chunk's page headers are read (only they) and checked against the
    chunk's metadata before pyarrow reads the row group: pyarrow allocates what a page
    header claims, and checks it against nothing."""
    out = _parquet_export(trail, tmp_path / "x")
    path = out / "records-00000.parquet"
    pages = _pages(path, column)
    # the export writes a dictionary for the columns whose values repeat, not for a
    # record's own (its text, id and hashes)
    first = parquet_pages.DICTIONARY_PAGE if column == "stream" else parquet_pages.DATA_PAGE
    assert pages[0][1].type == first, pages
    at, header = pages[page]
    _forge_header(path, at, header, **claims)
    _recompute_manifest_bytes(out)
    with _Pool() as pool:
        problems = _problems(out)
    assert pool.peak < 64 << 20, pool.peak  # the 2 GiB claim was allocated
    where = (f"at records-00000.parquet:row 1: file records-00000.parquet's row group 0 column "
             f"{column!r}: page {page + 1} (at byte {at:,}): ")  # fmt: skip
    assert any(p.startswith(where + said) for p in problems), problems
    assert not any("records-00000.parquet:row 2" in p for p in problems), problems
    _fails_clearly(out, f"page {page + 1} (at byte {at:,}): {said}")


def test_a_parquet_page_header_that_is_no_header_is_refused(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    """Bytes that are not a Thrift compact-protocol PageHeader: named, the rest of the
    file not read; the other files still are."""
    out = _parquet_export(trail, tmp_path / "x")
    path = out / "records-00001.parquet"
    at, _ = _pages(path, "hash")[0]
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\x15\x04\x15" + b"\xff" * 6 + b"\x01")  # type 2, then an i32 of 7 bytes
    _recompute_manifest_bytes(out)
    problems = _problems(out)
    said = (f"file records-00001.parquet's row group 0 column 'hash': page 1 (at byte {at:,}): "
            "its header is not a Parquet page header (a varint longer than its type)")  # fmt: skip
    assert any(said in p for p in problems), "\n".join(problems)
    assert any("records-00002" in p or "stream" in p for p in problems), problems  # read on
    _fails_clearly(out, "its header is not a Parquet page header")


def _repeating(out: Path, value: str, rows: int, **write: Any) -> Path:
    """``out``'s first records file replaced by ``rows`` rows, each column one value
    repeated (``record``: ``value``), written as pyarrow writes (``write``: its options)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {c: "x" for c in export_module.COLUMNS} | {"seq": 1, "record": value}
    schema = export_module._parquet_schema(pa)
    table = pa.table({c: pa.array([row[c]] * rows, schema.field(c).type)
                      for c in export_module.COLUMNS}, schema=schema)  # fmt: skip
    path = out / "records-00000.parquet"
    pq.write_table(table, path, compression="zstd", **write)
    _recompute_manifest_bytes(out)
    return path


def test_a_dictionary_column_repeating_a_long_value_is_decoded_in_slices(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    """2,000 rows of one 256 KiB record (its dictionary page holds it once, each row a
    few bits): the batch of 2,000 rows was decoded whole, 512 MiB in pyarrow and as
    much in Python; it is read as a dictionary and decoded about 32 MiB at a time."""
    out = _parquet_export(trail, tmp_path / "x")
    value = "v" * (256 << 10)
    path = _repeating(out, value, 2_000)
    assert path.stat().st_size < 64 << 10  # a few bits a row
    tracemalloc.start()
    try:
        with _Pool() as pool:
            problems = _problems(out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum("records-00000.parquet:row " in p and "is not JSON" in p
               for p in problems) == 2_000, problems[:3]  # fmt: skip
    assert pool.peak < 96 << 20, pool.peak
    assert peak < 96 << 20, peak
    # the slices: at most about BATCH_BYTES decoded each, every row in one
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path, read_dictionary=["record"])
    batch = next(parquet.iter_batches(batch_size=2_000, columns=["record"]))
    slices = export_verify._slices(batch)
    assert len(slices) > 8 and sum(n for _, n in slices) == 2_000, slices
    assert all(n * len(value) <= export_verify.BATCH_BYTES for _, n in slices), slices


def test_a_column_repeating_a_value_by_its_prefixes_is_refused(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    """DELTA_BYTE_ARRAY repeats a value as the prefix of the next, a few bits a row, as a
    dictionary does: the export never writes it, and the verifier does not read it."""
    out = _parquet_export(trail, tmp_path / "x")
    _repeating(out, "v" * (256 << 10), 2_000, use_dictionary=False,
               column_encoding={"record": "DELTA_BYTE_ARRAY"})  # fmt: skip
    with _Pool() as pool:
        problems = _problems(out)
    assert pool.peak < 64 << 20, pool.peak
    assert any("row group 0 column 'record': page 1 " in p and
               "its values are in encoding 7 (DELTA_BYTE_ARRAY), which the verifier does not "
               "read" in p for p in problems), problems  # fmt: skip
    _fails_clearly(out, "(DELTA_BYTE_ARRAY), which the verifier does not read")


def test_a_parquet_column_of_another_type_is_not_read(
    trail: dict[str, Any], tmp_path: Path
) -> None:
    """A column pyarrow would read as a type the export never writes (here JSON, which
    pyarrow does not read as a dictionary) is refused before a row is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = _parquet_export(trail, tmp_path / "x")
    path = out / "records-00000.parquet"
    table = pq.read_table(path)
    at = table.schema.get_field_index("record")
    table = table.set_column(at, pa.field("record", pa.json_()),
                             table.column("record").cast(pa.json_()))  # fmt: skip
    pq.write_table(table, path)
    _recompute_manifest_bytes(out)
    said = ("file records-00000.parquet is not read: its column 'record' is of type "
            "extension<arrow.json>, which the export never writes")  # fmt: skip
    assert any(p.startswith(said) for p in _problems(out)), _problems(out)
    _fails_clearly(out, "which the export never writes")


def test_page_headers_are_read_strictly() -> None:
    """The compact-protocol reader: unknown fields (statistics, CRC, an id past the
    known ones) skipped; a field twice, a wrong type, a struct nested too deep, a
    header cut short, refused."""
    read = parquet_pages.read_page_header
    sub = b"\x2c" + _i32(3) + _i32(8) + _i32(3) + _i32(3) + b"\x00"  # 5: DataPageHeader
    good = _i32(0) + _i32(100) + _i32(80) + _i32(7) + b"\x1c" + sub[1:]  # 4: crc, then 5
    header = read(good + b"\x00")
    assert (header.type, header.uncompressed_page_size, header.compressed_page_size,
            header.num_values, header.encoding, header.length) == (0, 100, 80, 3, 8, len(good) + 1)  # fmt: skip
    unknown = (
        b"\xa8\x03abc" + b"\x19\x35" + _varint(4) * 3 + b"\x1c\x00"
    )  # 14: bytes; a list; a struct
    assert read(good + unknown + b"\x00").num_values == 3
    for bad, why in [
        (_i32(0) + _i32(100) + b"\x05\x04" + _varint(160) + sub + b"\x00", "field 2 given twice"),
        (_i32(0) + _i32(100) + b"\x16\x02" + sub + b"\x00", "compressed_page_size is not an i32"),
        (_i32(0) + _i32(100) + _i32(80) + b"\x00", "a data page without its header"),
        (_i32(9) + _i32(100) + _i32(80) + sub + b"\x00", "an unknown page type 9"),
        (good + b"\xfc" * 20, "nested deeper than 16"),
    ]:
        with pytest.raises(parquet_pages.Malformed, match=why):
            read(bad)
    with pytest.raises(parquet_pages._Short):
        read(good)  # no stop: it goes on
