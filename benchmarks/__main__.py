"""Run every benchmark and write docs/benchmarks.md: ``python -m benchmarks``.

The tables are regenerated; the hand-written notes at the end of the file (from
``NOTES_MARKER`` on) are kept.

``--full`` grows the engine-scale benchmark to 500,000 documents (``make bench-full``;
routine runs stop at 100,000); ``--baseline REV`` measures the engine of git revision REV
side by side with the current one in the engine benchmarks.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
from pathlib import Path

from benchmarks import (
    aggregation_lag,
    audit,
    checkpointer,
    encryption,
    engine_auth,
    engine_commits,
    engine_group_commit,
    engine_reads,
    engine_scale,
    governance_policy,
    http_errors,
    takeover,
    vector_search,
)

COMMAND = "make bench  (= .venv/bin/python -m benchmarks)"
SUITES = [
    engine_commits.report,
    engine_group_commit.report,
    engine_scale.report,
    engine_auth.report,
    engine_reads.report,
    checkpointer.report,
    governance_policy.report,
    audit.report,
    encryption.report,
    takeover.report,
    vector_search.report,
    aggregation_lag.report,
    http_errors.report,
]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--full", action="store_true", help="engine scale up to 500k documents")
    parser.add_argument("--baseline", default=None, help="git revision of an engine to compare")
    args = parser.parse_args()
    command = COMMAND
    if args.full:
        os.environ["ACCORD_BENCH_FULL"] = "1"
        command = "make bench-full  (= .venv/bin/python -m benchmarks --full)"
    if args.baseline:
        os.environ["ACCORD_BENCH_BASELINE"] = args.baseline
        command += f" --baseline {args.baseline}"
    sections = []
    for suite in SUITES:
        text = suite()
        print(text, flush=True)
        sections.append(text)
    header = (
        "# Benchmarks\n\n"
        f"Produced by `{command}` on {dt.date.today().isoformat()}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{sys.platform}. These machines are shared and noisy: read the ratios between rows "
        "of one run, not the absolute numbers.\n\n"
    )
    out = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    out.write_text(header + "\n".join(sections) + kept_notes(out))
    print(f"wrote {out}")


#: Everything below this line in docs/benchmarks.md is written by hand (what a run showed,
#: earlier runs to compare with) and kept when the tables above it are regenerated.
NOTES_MARKER = "<!-- notes: written by hand, kept by python -m benchmarks -->"


def kept_notes(path: Path) -> str:
    """The hand-written notes section of ``path`` (from its marker on), or a new one."""
    text = path.read_text() if path.exists() else ""
    at = text.find(NOTES_MARKER)
    notes = text[at:] if at >= 0 else NOTES_MARKER + "\n\n## Notes\n"
    return "\n" + notes + ("" if notes.endswith("\n") else "\n")


if __name__ == "__main__":
    main()
