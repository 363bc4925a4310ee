"""LangGraph's own checkpointer-parametrized tests, run against accord's savers.

The contract (DESIGN.md): what passes with InMemorySaver passes with accord. This module

1. fetches the ``tests/`` of the installed langgraph's sdist (``tests.external.sdist``),
2. copies it into ``.accord/external/run/langgraph-<version>/``, keeping every upstream
   file byte for byte except that ``conftest.py`` becomes ``conftest_upstream.py`` and
   ``tests/external/langgraph_conftest.py`` becomes the run's ``conftest.py`` (it adds the
   savers and keeps only the tests parametrized by ``sync_checkpointer`` /
   ``async_checkpointer``),
3. starts ONE embedded engine (or uses ``MONGODB_URI``) and runs that tree with pytest in a
   subprocess, each MongoDB-backed test on a fresh database,
4. prints passed/failed/skipped per saver and the accord tests that fail while
   InMemorySaver passes them, grouped by cause, compared with the checked-in list of
   known failures (``langgraph_known_failures.txt``).

Command line (``make langgraph-suite``)::

    python -m tests.external.langgraph_suite                 # every saver, table + causes
    python -m tests.external.langgraph_suite --savers sync:memory,sync:accord -k interrupt
    python -m tests.external.langgraph_suite --write-known-failures   # after a fix lands

Exit status: 0 when the accord savers that ran fail exactly the known failures, 1 when a
new failure appears or a listed one passes (the list must then shrink), 2 on a harness
error. ``tests/external/test_langgraph_suite.py`` runs the same check in ``make test``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.external.sdist import CACHE_DIR, REPO_ROOT, fetch_sdist

HERE = Path(__file__).resolve().parent
CONFTEST = HERE / "langgraph_conftest.py"
KNOWN_FAILURES = HERE / "langgraph_known_failures.txt"
REFERENCE = "memory"
# (fixture kind, saver) pairs held to "passes whatever InMemorySaver passes".
CONTRACT: tuple[tuple[str, str], ...] = (
    ("sync", "accord"),
    ("async", "accord_async"),
    ("async", "accord"),
)
ALL_SAVERS = (
    "sync:memory,sync:mongodb,sync:accord,async:memory,async:mongodb,async:accord_async,async:accord"
)
# What `make test` runs: the reference and the accord savers (MongoDBSaver is a comparison).
CONTRACT_SAVERS = "sync:memory,sync:accord,async:memory,async:accord_async,async:accord"
LABELS = {
    "memory": "InMemorySaver",
    "mongodb": "MongoDBSaver",
    "accord": "AccordSaver",
    "accord_async": "AsyncAccordSaver",
}
PER_TEST_TIMEOUT_S = 120

# Known causes, recognised in a failure's exception text; anything else is grouped by its
# exception type and first words.
CAUSES: tuple[tuple[str, str], ...] = (
    (
        "__accord_branch_from",
        "configs returned carry an extra __accord_branch_from key",
    ),
    (
        "was never saved (another worker advanced",
        "put_writes before its checkpoint's put refused (ConcurrentRunError)",
    ),
    (
        "but this worker started it as a new thread",
        "subgraph restarted as a new root on replay refused as a second worker",
    ),
    (
        "human:new_answer",
        "resumed fork of a replayed subgraph returns the OLD interrupt answer",
    ),
    (
        "AsyncAccordSaver is the async checkpointer",
        "sync call on AsyncAccordSaver from a worker thread refused",
    ),
    (
        "AccordSaver is the sync checkpointer",
        "AccordSaver refuses the async (a*) methods",
    ),
)


@dataclass
class Result:
    """One test under one saver, as the run's conftest recorded it."""

    nodeid: str
    kind: str
    saver: str
    outcome: str
    keys: list[str]
    message: str = ""
    details: str = ""
    duration: float = 0.0

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Result:
        return cls(
            nodeid=rec["nodeid"],
            kind=rec["kind"],
            saver=rec["saver"],
            outcome=rec["outcome"],
            keys=list(rec.get("keys") or []),
            message=rec.get("message", ""),
            details=rec.get("details", ""),
            duration=float(rec.get("duration", 0.0)),
        )


@dataclass
class SuiteRun:
    """The outcome of one run of the suite."""

    version: str
    savers: str
    results: list[Result]
    wall_s: float
    returncode: int
    log: Path
    uri: str = field(default="")


class HarnessError(RuntimeError):
    """The suite could not be run (the message says why and where the log is)."""


# -- running -----------------------------------------------------------------------------


def prepare_tree(version: str | None = None) -> tuple[Path, str]:
    """Copy the sdist's tests into a fresh run directory with our conftest; (root, version)."""
    sdist = fetch_sdist("langgraph", version)
    version = sdist.name.rsplit("-", 1)[1]
    run = CACHE_DIR / "run" / f"langgraph-{version}"
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    # Only tests/ and the pytest configuration: the sdist's langgraph/ must not shadow
    # the installed package.
    shutil.copytree(sdist / "tests", run / "tests")
    shutil.copy2(sdist / "pyproject.toml", run / "pyproject.toml")
    (run / "tests" / "conftest.py").rename(run / "tests" / "conftest_upstream.py")
    shutil.copy2(CONFTEST, run / "tests" / "conftest.py")
    return run, version


def run_suite(
    savers: str = CONTRACT_SAVERS,
    *,
    select: str | None = None,
    workers: int = 0,
    version: str | None = None,
    echo: bool = False,
) -> SuiteRun:
    """Run the checkpointer-parametrized tests for ``savers`` ("kind:name,...")."""
    run, version = prepare_tree(version)
    logs = CACHE_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = logs / f"langgraph-{version}-{stamp}-{os.getpid()}.log"
    results_path = logs / f"langgraph-{version}-{stamp}-{os.getpid()}.json"
    uri = os.environ.get("MONGODB_URI", "")
    engine_dir: Path | None = None
    started = time.monotonic()
    try:
        if not uri:
            from accord.platform import ensure_engine

            engine_dir = Path(tempfile.mkdtemp(prefix="accord-lg-engine-"))
            uri = ensure_engine(engine_dir, sync=False)
        env = {
            **os.environ,
            "NO_DOCKER": "true",  # the suite's postgres/redis variants need docker
            "ACCORD_LG_SAVERS": savers,
            "ACCORD_LG_RESULTS": str(results_path),
            "ACCORD_LG_MONGODB_URI": uri,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"]
        # The suite's own addopts add --full-trace and --durations; keep its strictness.
        cmd += ["-o", "addopts=--strict-markers --snapshot-warn-unused", "--tb=short"]
        cmd += [f"--timeout={PER_TEST_TIMEOUT_S}", "-W", "ignore::DeprecationWarning"]
        if select:
            cmd += ["-k", select]
        if workers > 1:
            cmd += ["-n", str(workers)]
        with open(log, "w") as out:
            proc = subprocess.Popen(
                cmd, cwd=run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                if echo:
                    sys.stdout.write(line)
            returncode = proc.wait()
    finally:
        if engine_dir is not None:
            from accord.platform import stop_engine

            stop_engine(engine_dir)
            shutil.rmtree(engine_dir, ignore_errors=True)
    wall = time.monotonic() - started
    records: list[dict[str, Any]] = []
    for part in sorted(logs.glob(results_path.name + "*")):
        records += json.loads(part.read_text())
        part.unlink()
    # pytest exits 1 when tests fail; anything else means the run itself went wrong.
    if returncode not in (0, 1) or not records:
        raise HarnessError(
            f"LangGraph's suite did not run (pytest exit {returncode}, {len(records)} results); "
            f"see {log}"
        )
    return SuiteRun(version, savers, [Result.from_record(r) for r in records], wall, returncode, log, uri)


# -- reading the results -----------------------------------------------------------------


def counts(results: Iterable[Result]) -> dict[tuple[str, str], collections.Counter[str]]:
    """Outcome counts per (kind, saver)."""
    table: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for r in results:
        table[(r.kind, r.saver)][r.outcome] += 1
    return dict(table)


def regressions(results: Sequence[Result], reference: str = REFERENCE) -> list[Result]:
    """Tests that did not pass under a non-reference saver while the reference passed them."""
    passed = {
        (r.kind, key)
        for r in results
        if r.saver == reference and r.outcome == "passed"
        for key in r.keys
    }
    return [
        r
        for r in results
        if r.saver != reference
        and r.outcome != "passed"
        and any((r.kind, key) in passed for key in r.keys)
    ]


def cause(result: Result) -> str:
    """A short name for why ``result`` failed (known causes first)."""
    text = f"{result.message}\n{result.details}"
    for needle, name in CAUSES:
        if needle in text:
            return name
    if result.outcome == "skipped":
        return f"skipped: {result.message[:80]}"
    first = result.message.split(":", 1)
    if len(first) == 2 and re.fullmatch(r"[\w.]+", first[0]):
        return f"{first[0]}: {' '.join(first[1].split()[:8])}"
    return " ".join(result.message.split()[:10]) or result.outcome


def load_known_failures(path: Path = KNOWN_FAILURES) -> dict[str, str]:
    """``{nodeid: cause}`` from the checked-in list (``[cause]`` headers, one node id a line)."""
    known: dict[str, str] = {}
    section = ""
    for raw in path.read_text().splitlines() if path.exists() else []:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        known[line] = section
    return known


def write_known_failures(regs: Sequence[Result], path: Path = KNOWN_FAILURES) -> None:
    by_cause: dict[str, list[str]] = collections.defaultdict(list)
    for r in regs:
        by_cause[cause(r)].append(r.nodeid)
    lines = [
        "# accord tests of LangGraph's suite that fail while InMemorySaver passes them.",
        "# tests/external/test_langgraph_suite.py fails when a test NOT listed here fails, and",
        "# when a listed test passes (then delete its line: the list only shrinks).",
        "# Regenerate: python -m tests.external.langgraph_suite --write-known-failures",
        "# Details and the causes: docs/external-suites.md.",
    ]
    for name in sorted(by_cause, key=lambda c: (-len(by_cause[c]), c)):
        lines += ["", f"[{name}]", *sorted(by_cause[name])]
    path.write_text("\n".join(lines) + "\n")


def contract_results(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if (r.kind, r.saver) in CONTRACT]


def compare_known(
    results: Sequence[Result], known: dict[str, str]
) -> tuple[list[Result], list[str]]:
    """(new failures not in ``known``, listed tests that ran under the contract and passed)."""
    regs = [r for r in regressions(results) if (r.kind, r.saver) in CONTRACT]
    new = [r for r in regs if r.nodeid not in known]
    ran_ok = {r.nodeid for r in contract_results(results) if r.outcome == "passed"}
    fixed = sorted(n for n in known if n in ran_ok)
    return new, fixed


def format_table(run: SuiteRun) -> str:
    rows = counts(run.results)
    regs = regressions(run.results)
    lost = collections.Counter((r.kind, r.saver) for r in regs)
    out = [
        f"LangGraph {run.version}: checkpointer-parametrized tests "
        f"({run.wall_s:.0f}s wall, {run.uri or 'embedded engine'})",
        f"{'saver':<18} {'fixture':<18} {'passed':>7} {'failed':>7} {'errors':>7} "
        f"{'skipped':>8} {'total':>6} {'vs memory':>10} {'test time':>10}",
    ]
    seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
    for r in run.results:
        seconds[(r.kind, r.saver)] += r.duration
    order = list(LABELS)
    for kind, saver in sorted(
        rows, key=lambda ks: (order.index(ks[1]) if ks[1] in order else 99, ks[0] != "sync")
    ):
        c = rows[(kind, saver)]
        label = LABELS.get(saver, saver)
        behind = "" if saver == REFERENCE else f"-{lost[(kind, saver)]}"
        out.append(
            f"{label:<18} {kind + '_checkpointer':<18} {c['passed']:>7} {c['failed']:>7} "
            f"{c['error']:>7} {c['skipped'] + c['xfailed']:>8} {sum(c.values()):>6} {behind:>10} "
            f"{seconds[(kind, saver)]:>9.0f}s"
        )
    out.append("('vs memory': tests this saver does not pass that InMemorySaver passes)")
    return "\n".join(out)


def format_causes(regs: Sequence[Result]) -> str:
    out = []
    for kind, saver in sorted({(r.kind, r.saver) for r in regs}):
        mine = [r for r in regs if (r.kind, r.saver) == (kind, saver)]
        out.append(f"{LABELS.get(saver, saver)} ({kind}_checkpointer): {len(mine)} behind memory")
        for name, n in collections.Counter(cause(r) for r in mine).most_common():
            out.append(f"  {n:>4}  {name}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.external.langgraph_suite", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--savers",
        default=ALL_SAVERS,
        help=f"comma-separated kind:saver entries (default {ALL_SAVERS})",
    )
    parser.add_argument("-k", dest="select", help="pytest -k expression to run a subset")
    parser.add_argument("-n", dest="workers", type=int, default=0, help="pytest-xdist workers")
    parser.add_argument("--echo", action="store_true", help="stream pytest's output")
    parser.add_argument(
        "--write-known-failures",
        action="store_true",
        help=f"rewrite {KNOWN_FAILURES.relative_to(REPO_ROOT)} from this run",
    )
    args = parser.parse_args(argv)
    try:
        run = run_suite(args.savers, select=args.select, workers=args.workers, echo=args.echo)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(run))
    regs = regressions(run.results)
    if regs:
        print("\nFailures where InMemorySaver passes, by cause:")
        print(format_causes(regs))
    print(f"\nlog: {run.log}")
    if args.write_known_failures:
        if args.select or not all(f"{k}:{s}" in args.savers for k, s in CONTRACT):
            print("error: --write-known-failures needs a full run of the contract savers")
            return 2
        write_known_failures([r for r in regs if (r.kind, r.saver) in CONTRACT])
        print(f"wrote {KNOWN_FAILURES.relative_to(REPO_ROOT)}")
        return 0
    new, fixed = compare_known(run.results, load_known_failures())
    for r in new:
        print(f"NEW FAILURE: {r.nodeid}: {cause(r)}")
    for n in fixed:
        print(f"NOW PASSES (delete from {KNOWN_FAILURES.name}): {n}")
    return 1 if new or fixed else 0


if __name__ == "__main__":
    sys.exit(main())
