"""``python -m benchmarks`` regenerates docs/benchmarks.md's tables and keeps the notes
written by hand below its marker."""

from __future__ import annotations

from pathlib import Path

from benchmarks.__main__ import NOTES_MARKER, kept_notes


def test_the_hand_written_notes_are_kept(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    notes = f"{NOTES_MARKER}\n\n## Notes\n\nAn earlier run at load 9: 1.3x.\n"
    report.write_text("# Benchmarks\n\n| old | table |\n\n" + notes)
    assert kept_notes(report) == "\n" + notes


def test_a_report_without_notes_gets_an_empty_notes_section(tmp_path: Path) -> None:
    assert kept_notes(tmp_path / "missing.md").startswith("\n" + NOTES_MARKER)
    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n")
    assert "## Notes" in kept_notes(report)


def test_the_committed_report_has_its_notes_section() -> None:
    report = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
    assert NOTES_MARKER in report.read_text()
