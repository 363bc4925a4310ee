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
from accord.governance import export_verify
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
