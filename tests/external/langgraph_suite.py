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
import re
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.external import harness
from tests.external.harness import HarnessError, fresh_copy
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
ALL_SAVERS = "sync:memory,sync:mongodb,sync:accord,async:memory,async:mongodb,async:accord_async,async:accord"
# What `make test` runs: the reference and the accord savers (MongoDBSaver is a comparison).
CONTRACT_SAVERS = "sync:memory,sync:accord,async:memory,async:accord_async,async:accord"
LABELS = {
    "memory": "InMemorySaver",
    "mongodb": "MongoDBSaver",
    "accord": "AccordSaver",
    "accord_async": "AsyncAccordSaver",
}
PER_TEST_TIMEOUT_S = 120

# Known causes, recognised in a failure's exception text (a regular expression each);
# anything else is grouped by its exception type and first words.
CAUSES: tuple[tuple[str, str], ...] = (
    (r"__accord_branch_from", "configs returned carry an extra __accord_branch_from key"),
    (
        r"was never saved \(another worker advanced",
        "put_writes before its checkpoint's put refused (ConcurrentRunError)",
    ),
    (
        r"but this worker started it as a new thread",
        "subgraph restarted as a new root on replay refused as a second worker",
    ),
    (
        r"'human:new_answer' in ",
        "resumed fork of a replayed subgraph returns the OLD interrupt answer",
    ),
    (
        r"AsyncAccordSaver is the async checkpointer",
        "sync call on AsyncAccordSaver from a worker thread refused",
    ),
    (r"AccordSaver is the sync checkpointer", "AccordSaver refuses the async (a*) methods"),
    (
        r"id='00000000-0000-4000-8000-\d{12}'.* != .*id='00000000-0000-4000-8000-\d{12}'",
        "ids from the test's mocked uuid.uuid4 shifted: pymongo draws session ids from it",
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
    #: CPU seconds of the pytest run (with its workers) and of the engine it used.
    client_cpu_s: float = 0.0
    engine_cpu_s: float | None = None


# -- running -----------------------------------------------------------------------------


def prepare_tree(version: str | None = None) -> tuple[Path, str]:
    """Copy the sdist's tests into a fresh run directory with our conftest; (root, version)."""
    sdist = fetch_sdist("langgraph", version)
    version = sdist.name.rsplit("-", 1)[1]
    run = CACHE_DIR / "run" / f"langgraph-{version}"
    # Only tests/ and the pytest configuration: the sdist's langgraph/ must not shadow
    # the installed package.
    fresh_copy(sdist / "tests", run / "tests")
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
    log, results_path = harness.run_files(f"langgraph-{version}")
    args = ["tests", "-q", "-p", "no:cacheprovider", "--tb=short"]
    # The suite's own addopts add --full-trace and --durations; keep its strictness.
    args += ["-o", "addopts=--strict-markers --snapshot-warn-unused"]
    args += [f"--timeout={PER_TEST_TIMEOUT_S}", "-W", "ignore::DeprecationWarning"]
    if select:
        args += ["-k", select]
    if workers > 1:
        args += ["-n", str(workers)]
    started = time.monotonic()
    with harness.engine() as server:
        env = {
            "NO_DOCKER": "true",  # the suite's postgres/redis variants need docker
            "ACCORD_LG_SAVERS": savers,
            "ACCORD_LG_RESULTS": str(results_path),
            "ACCORD_LG_MONGODB_URI": server.uri,
        }
        returncode, cpu = harness.run_pytest(args, cwd=run, env=env, log=log, echo=echo)
    wall = time.monotonic() - started
    records: list[dict[str, Any]] = []
    for part in sorted(results_path.parent.glob(results_path.name + "*")):
        records += json.loads(part.read_text())

    # pytest exits 1 when tests fail; anything else means the run itself went wrong.
    if returncode not in (0, 1) or not records:
        raise HarnessError(
            f"LangGraph's suite did not run (pytest exit {returncode}, {len(records)} results); "
            f"see {log}"
        )
    return SuiteRun(
        version=version,
        savers=savers,
        results=[Result.from_record(r) for r in records],
        wall_s=wall,
        returncode=returncode,
        log=log,
        uri=server.uri if not server.embedded else "",
        client_cpu_s=cpu,
        engine_cpu_s=server.cpu_s,
    )


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
    for pattern, name in CAUSES:
        if re.search(pattern, text):
            return name
    if result.outcome == "skipped":
        return f"skipped: {result.message[:80]}"
    first = result.message.split(":", 1)
    if len(first) == 2 and re.fullmatch(r"[\w.]+", first[0]):
        return f"{first[0]}: {' '.join(first[1].split()[:8])}"
    return " ".join(result.message.split()[:10]) or result.outcome


FLAKY = "flaky: "  # section prefix: tests whose outcome depends on timing, for every saver


@dataclass
class Known:
    """The checked-in list: failing node ids by cause, and timing-dependent tests.

    ``failing`` names accord tests that fail while InMemorySaver passes them; the list only
    shrinks. ``flaky`` names test functions (``path::name``, every parametrization) seen to
    fail intermittently under InMemorySaver too; their outcome is not compared.
    """

    failing: dict[str, str] = field(default_factory=dict)
    flaky: dict[str, str] = field(default_factory=dict)

    def is_flaky(self, nodeid: str) -> bool:
        return nodeid.split("[", 1)[0] in self.flaky


def load_known_failures(path: Path = KNOWN_FAILURES) -> Known:
    """Parse the list: ``[cause]`` headers, then one node id a line (``#`` comments)."""
    known = Known()
    section = ""
    for raw in path.read_text().splitlines() if path.exists() else []:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section.startswith(FLAKY):
            known.flaky[line] = section[len(FLAKY) :]
        else:
            known.failing[line] = section
    return known


def write_known_failures(regs: Sequence[Result], path: Path = KNOWN_FAILURES) -> None:
    """Rewrite the list from ``regs``, keeping its flaky sections as they are."""
    flaky = load_known_failures(path).flaky
    by_cause: dict[str, list[str]] = collections.defaultdict(list)
    for r in regs:
        if not flaky or r.nodeid.split("[", 1)[0] not in flaky:
            by_cause[cause(r)].append(r.nodeid)
    lines = [
        "# accord tests of LangGraph's suite that fail while InMemorySaver passes them.",
        "# tests/external/test_langgraph_suite.py fails when a test NOT listed here fails, and",
        "# when a listed test passes (then delete its line: the list only shrinks).",
        "# [flaky: REASON] sections name test functions whose outcome depends on timing for",
        "# every saver (seen failing under InMemorySaver too); they are not compared.",
        "# Regenerate: python -m tests.external.langgraph_suite --write-known-failures",
        "# Details and the causes: docs/external-suites.md.",
    ]
    by_reason: dict[str, list[str]] = collections.defaultdict(list)
    for name, reason in flaky.items():
        by_reason[reason].append(name)
    for reason in sorted(by_reason):
        lines += ["", f"[{FLAKY}{reason}]", *sorted(by_reason[reason])]
    for name in sorted(by_cause, key=lambda c: (-len(by_cause[c]), c)):
        lines += ["", f"[{name}]", *sorted(by_cause[name])]
    path.write_text("\n".join(lines) + "\n")


def contract_results(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if (r.kind, r.saver) in CONTRACT]


def compare_known(results: Sequence[Result], known: Known) -> tuple[list[Result], list[str]]:
    """(new failures not listed, listed tests that ran under a contract saver and passed)."""
    regs = [r for r in regressions(results) if (r.kind, r.saver) in CONTRACT]
    new = [r for r in regs if r.nodeid not in known.failing and not known.is_flaky(r.nodeid)]
    ran_ok = {r.nodeid for r in contract_results(results) if r.outcome == "passed"}
    fixed = sorted(n for n in known.failing if n in ran_ok)
    return new, fixed


def format_table(run: SuiteRun) -> str:
    rows = counts(run.results)
    regs = regressions(run.results)
    lost = collections.Counter((r.kind, r.saver) for r in regs)
    engine_cpu = "n/a" if run.engine_cpu_s is None else f"{run.engine_cpu_s:.0f}s"
    out = [
        f"LangGraph {run.version}: checkpointer-parametrized tests on "
        f"{run.uri or 'the embedded engine'}; {run.wall_s:.0f}s wall, "
        f"CPU {run.client_cpu_s:.0f}s pytest + {engine_cpu} engine",
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
