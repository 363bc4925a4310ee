"""Run every benchmark and write docs/benchmarks.md: ``python -m benchmarks``."""

from __future__ import annotations

import datetime as dt
import platform
import sys
from pathlib import Path

from benchmarks import aggregation_lag, checkpointer, engine_commits, vector_search

COMMAND = "make bench  (= .venv/bin/python -m benchmarks)"
SUITES = [
    engine_commits.report,
    checkpointer.report,
    vector_search.report,
    aggregation_lag.report,
]


def main() -> None:
    sections = []
    for suite in SUITES:
        text = suite()
        print(text, flush=True)
        sections.append(text)
    header = (
        "# Benchmarks\n\n"
        f"Produced by `{COMMAND}` on {dt.date.today().isoformat()}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{sys.platform}. These machines are shared and noisy: read the ratios between rows "
        "of one run, not the absolute numbers.\n\n"
    )
    out = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    out.write_text(header + "\n".join(sections))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
