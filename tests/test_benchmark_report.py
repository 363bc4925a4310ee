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


def test_the_install_size_table_replaces_its_block_and_keeps_the_rest(tmp_path: Path) -> None:
    from benchmarks.install_size import END, START, Size, table, write_report

    report = tmp_path / "benchmarks.md"
    report.write_text(f"# Benchmarks\n\n{NOTES_MARKER}\n\n## Notes\n\nby hand\n")
    sizes = [
        Size("accord", "core", 56, 199.0, 1.0),
        Size("accord[server]", "+ doors", 75, 230.0, 1.0),
    ]
    write_report("### Install sizes\n\n" + table(sizes), report)
    write_report("### Install sizes\n\n" + table(sizes[:1]), report)  # a second run
    text = report.read_text()
    assert text.count(START) == 1 and text.count(END) == 1 and "by hand" in text
    assert "| `pip install accord` | core | 56 | 199 | 1.00x |" in text
    assert "accord[server]" not in text  # the second run's table replaced the first
    assert NOTES_MARKER in text and text.index(NOTES_MARKER) < text.index(START)
