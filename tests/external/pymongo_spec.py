"""MongoDB's driver spec tests, run by pymongo's own test runner against accord's engine.

The embedded engine's contract is MongoDB's behaviour as the driver specifications test it.
This module

1. fetches the ``test/`` tree of the installed pymongo's sdist (``tests.external.sdist``),
2. copies it (unchanged) into ``.accord/external/run/pymongo-<version>/`` with a recording
   plugin beside it (``pymongo_plugin.py``; it changes no test),
3. starts ONE embedded engine with ``--enable-test-commands`` (or uses ``MONGODB_URI``) and
   points pymongo's runner at it (``DB_IP``/``DB_PORT``),
4. runs the spec suites below and prints passed / failed / skipped per suite, the most
   common failure causes, and the comparison with the checked-in baseline
   (``pymongo_spec_baseline.json``).

Tests that cannot apply to a one-node replica set are skipped by the specs' own
``runOnRequirements`` (sharded, load-balanced, serverless, auth, ...); see
docs/external-suites.md.

Command line (``make spec``)::

    python -m tests.external.pymongo_spec                  # every suite, table + causes
    python -m tests.external.pymongo_spec --suites crud -k insert
    python -m tests.external.pymongo_spec --write-baseline  # raise the baseline after a fix

Exit status: 0 when no suite passes fewer tests than its baseline, 1 otherwise, 2 when the
harness itself could not run. ``tests/external/test_pymongo_spec.py`` checks the same in
``make test``.
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
PLUGIN = HERE / "pymongo_plugin.py"
BASELINE = HERE / "pymongo_spec_baseline.json"
PER_TEST_TIMEOUT_S = 60

# Spec suite -> pymongo's test module that runs it. Unified-format suites are reported by
# their spec directory (test_transactions_unified runs two), prose modules as "<module> (prose)".
MODULES: dict[str, tuple[str, ...]] = {
    "crud": ("test/test_crud_unified.py",),
    "transactions": ("test/test_transactions_unified.py",),
    "transactions-convenient-api": ("test/test_transactions_unified.py",),
    "retryable_writes": ("test/test_retryable_writes_unified.py",),
    "retryable_reads": ("test/test_retryable_reads_unified.py",),
    "sessions": ("test/test_sessions_unified.py",),
    "collection_management": ("test/test_collection_management.py",),
    "command_monitoring": ("test/test_command_monitoring.py",),
    "causal_consistency": ("test/test_causal_consistency.py",),
    # pymongo's prose tests for the same specifications (the legacy JSON formats of these
    # suites were converted to the unified format; these are what remains outside it).
    "test_transactions (prose)": ("test/test_transactions.py",),
    "test_session (prose)": ("test/test_session.py",),
    "test_retryable_writes (prose)": ("test/test_retryable_writes.py",),
    "test_retryable_reads (prose)": ("test/test_retryable_reads.py",),
    # Authentication (SCRAM-SHA-256 / SHA-1), on a second engine started with --auth:
    # the spec's connection-string tests and its unified tests (MONGODB-OIDC only: all
    # skipped), and pymongo's SCRAM prose tests (test_auth.py: SCRAM-SHA-1, SCRAM-SHA-256,
    # mechanism negotiation, SASLprep, URI options; GSSAPI and PLAIN skip themselves).
    "auth": ("test/test_auth_spec.py",),
    "test_auth_spec (prose)": ("test/test_auth_spec.py",),
    "test_auth (prose)": ("test/test_auth.py",),
}
SUITES = tuple(MODULES)
# Suites that need a server with authentication on; the rest run on one without.
AUTH_SUITES = frozenset({"auth", "test_auth_spec (prose)", "test_auth (prose)"})
# The user pymongo's runner creates (through the localhost exception) and runs as there.
AUTH_ENV = {"DB_USER": "accord_spec", "DB_PASSWORD": "accord-spec-password"}


@dataclass
class Result:
    nodeid: str
    suite: str
    outcome: str
    message: str = ""
    duration: float = 0.0


@dataclass
class SpecRun:
    version: str
    results: list[Result]
    wall_s: float
    client_cpu_s: float
    engine: harness.Engine
    log: Path
    suites: tuple[str, ...] = field(default=SUITES)
    logs: tuple[Path, ...] = ()


def prepare_tree(version: str | None = None) -> tuple[Path, str]:
    """Copy the sdist's ``test/`` and pytest configuration into a fresh run directory."""
    sdist = fetch_sdist("pymongo", version)
    version = sdist.name.rsplit("-", 1)[1]
    run = CACHE_DIR / "run" / f"pymongo-{version}"
    # Only test/ and pyproject.toml: the sdist's pymongo/ and bson/ (pure Python, no C
    # extensions) must not shadow the installed driver.
    fresh_copy(sdist / "test", run / "test")
    shutil.copy2(sdist / "pyproject.toml", run / "pyproject.toml")
    shutil.copy2(PLUGIN, run / "accord_spec_plugin.py")
    return run, version


def run_specs(
    suites: Sequence[str] = SUITES,
    *,
    select: str | None = None,
    version: str | None = None,
    echo: bool = False,
) -> SpecRun:
    """Run pymongo's runner for ``suites``: one engine with test commands enabled for the
    suites without authentication, a second one also with ``--auth`` for ``AUTH_SUITES``."""
    unknown = [s for s in suites if s not in MODULES]
    if unknown:
        raise HarnessError(f"unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    run, version = prepare_tree(version)
    groups = [
        [s for s in suites if s not in AUTH_SUITES],
        [s for s in suites if s in AUTH_SUITES],
    ]
    started = time.monotonic()
    results: list[Result] = []
    cpu = 0.0
    engines: list[harness.Engine] = []
    logs: list[Path] = []
    for auth, group in zip((False, True), groups, strict=True):
        if not group:
            continue
        label = f"pymongo-{version}" + ("-auth" if auth else "")
        records, used, server, log = _run_group(run, label, group, select, echo, auth=auth)
        cpu += used
        engines.append(server)
        logs.append(log)
        wanted = set(group)
        results += [
            Result(
                r["nodeid"], r["suite"], r["outcome"], r.get("message", ""), r.get("duration", 0)
            )
            for r in records
            if r["suite"] in wanted
        ]
    wall = time.monotonic() - started
    engine = _combined(engines)
    return SpecRun(version, results, wall, cpu, engine, logs[-1], tuple(suites), tuple(logs))


def _run_group(
    run: Path, label: str, suites: Sequence[str], select: str | None, echo: bool, *, auth: bool
) -> tuple[list[dict[str, Any]], float, harness.Engine, Path]:
    """pymongo's runner on ``suites`` against one engine (with ``--auth`` if ``auth``)."""
    log, results_path = harness.run_files(label)
    modules = sorted({m for s in suites for m in MODULES[s]})
    args = [*modules, "-p", "accord_spec_plugin", "-p", "no:cacheprovider", "-q", "--tb=line"]
    # pymongo's addopts write a junit file and select its "default" marker; keep the marker
    # (the authentication modules carry pymongo's "auth" marker instead).
    marker = "auth" if auth else "default or default_async"
    args += ["-o", f"addopts=--strict-markers -m '{marker}'", "-rN"]
    args += [f"--timeout={PER_TEST_TIMEOUT_S}", "--durations=20"]
    if select:
        args += ["-k", select]
    # Port 27017 when free: a few of pymongo's tests ignore DB_PORT and dial the default.
    with harness.engine(enable_test_commands=True, prefer_port=27017, auth=auth) as server:
        env = {"ACCORD_SPEC_RESULTS": str(results_path)}
        if server.embedded:
            env |= {"DB_IP": server.host, "DB_PORT": str(server.port)}
        else:
            env |= _env_for_uri(server.uri)
        if auth:
            env |= AUTH_ENV
        code, cpu = harness.run_pytest(args, cwd=run, env=env, log=log, echo=echo)
    records = json.loads(results_path.read_text()) if results_path.exists() else []
    if code == 5 and select:  # -k selected nothing of this group
        return [], cpu, server, log
    if code not in (0, 1) or not records:
        raise HarnessError(
            f"pymongo's spec tests did not run (pytest exit {code}, {len(records)} results); "
            f"see {log}"
        )
    return records, cpu, server, log


def _combined(engines: list[harness.Engine]) -> harness.Engine:
    """One report for the engines of a run: CPU summed, down if any was down at its end."""
    if len(engines) == 1:
        return engines[0]
    first = engines[0]
    cpus = [e.cpu_s for e in engines]
    return harness.Engine(
        uri=first.uri,
        host=first.host,
        port=first.port,
        embedded=first.embedded,
        cpu_s=None if any(c is None for c in cpus) else sum(c for c in cpus if c is not None),
        alive_at_end=None
        if all(e.alive_at_end is None for e in engines)
        else all(e.alive_at_end is not False for e in engines),
        log_tail="\n".join(e.log_tail for e in engines if e.alive_at_end is False),
    )


def _env_for_uri(uri: str) -> dict[str, str]:
    """DB_IP/DB_PORT for a plain ``mongodb://host:port/...`` URI (pymongo's runner's inputs)."""
    m = re.match(r"mongodb://(?:[^@/]*@)?([^:/,?]+)(?::(\d+))?", uri)
    if not m:
        raise HarnessError(f"cannot point pymongo's test runner at {uri!r}: need host[:port]")
    return {"DB_IP": m.group(1), "DB_PORT": m.group(2) or "27017"}


# -- reading the results -----------------------------------------------------------------


def counts(results: Iterable[Result]) -> dict[str, collections.Counter[str]]:
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in results:
        table[r.suite][r.outcome] += 1
    return dict(table)


_NOISE = [
    (re.compile(r"ObjectId\('[0-9a-f]{24}'\)"), "ObjectId(...)"),
    (re.compile(r"\b[0-9a-f]{24}\b"), "<oid>"),
    (re.compile(r"\d+"), "N"),
]


def cause(result: Result) -> str:
    """A failure's message reduced to a groupable signature.

    The server's ``errmsg`` when the message carries one, else the message with documents,
    ids and numbers elided (``'readConcern' not found in {...}``).
    """
    text = re.sub(r"^[\w/.]+\.py:\d+: ", "", result.message)  # --tb=line prefix
    kind = text.split(":", 1)[0] if re.match(r"^[\w.]+:", text) else ""
    errmsg = re.search(r"""'errmsg': (['"])(.*?)\1""", text)
    if errmsg:
        text = f"{kind}: {errmsg.group(2)}" if kind else errmsg.group(2)
    else:
        text = re.sub(r"[{\[(].*", "{...}", text) if len(text) > 100 else text
    for pattern, repl in _NOISE:
        text = pattern.sub(repl, text)
    return text[:160]


# Engine features that failures point to: (regex on "node id | message", feature), first
# match wins. What no rule names is grouped by its message (``cause``).
FEATURES: tuple[tuple[str, str], ...] = (
    (r"no such command: 'configureFailPoint'", "configureFailPoint (fail points) missing"),
    (
        r"'readConcern' not found|TestCausalConsistency.*unexpectedly None|afterClusterTime",
        "no operationTime/$clusterTime in replies, so no afterClusterTime (causal consistency)",
    ),
    (r"SnapshotSessions|atClusterTime", "snapshot sessions not honoured (reads, refused writes)"),
    (r"\$out and \$merge", "$out/$merge missing"),
    (r"\$setField|\$getField", "$setField/$getField missing"),
    (r"cannot evaluate filter: '", "let variables ($$name) not supported"),
    (r"Collation", "collation ignored"),
    (r"DotsAndDollars|prefixed field names", "$-prefixed field name rules"),
    (
        r"TestUnifiedCreate(Collection|Index)::",
        "DDL inside a transaction visible before commit",
    ),
    (r"_on_views|viewOn", "views"),
    (r"\$changeStream", "change streams missing"),
    (r"\$listLocalSessions", "$listLocalSessions missing"),
    (r"[Ss]econdary", "secondary read preference (one node: no secondaries)"),
    (
        r"test_scram_threaded",
        "$where (server-side JavaScript) is not supported: the test queries with it",
    ),
    (r"no such command: '(\w+)'", "command missing: {0}"),
)


def feature(result: Result) -> str:
    """The engine feature a failure points to (FEATURES), else its grouped message."""
    text = f"{result.nodeid} | {result.message}"
    for pattern, name in FEATURES:
        m = re.search(pattern, text)
        if m:
            return name.format(*m.groups())
    return cause(result)


def failure_causes(results: Sequence[Result], top: int = 25) -> list[tuple[str, int, list[str]]]:
    """(cause, count, suites) for failed and errored tests, most common first."""
    groups: dict[str, list[Result]] = collections.defaultdict(list)
    for r in results:
        if r.outcome in ("failed", "error"):
            groups[feature(r)].append(r)
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))[:top]
    return [(c, len(rs), sorted({r.suite for r in rs})) for c, rs in ranked]


def format_table(run: SpecRun) -> str:
    table = counts(run.results)
    engine_cpu = "n/a" if run.engine.cpu_s is None else f"{run.engine.cpu_s:.0f}s"
    where = "the embedded engine" if run.engine.embedded else run.engine.uri
    out = [
        f"pymongo {run.version} spec tests on {where}; {run.wall_s:.0f}s wall, "
        f"CPU {run.client_cpu_s:.0f}s pytest + {engine_cpu} engine",
        f"{'suite':<32} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8} "
        f"{'applicable':>11} {'pass rate':>10}",
    ]
    total: collections.Counter[str] = collections.Counter()
    for suite in run.suites:
        c = table.get(suite, collections.Counter())
        total.update(c)
        out.append(_row(suite, c))
    out.append(_row("TOTAL", total))
    out.append("(applicable: passed + failed + errors; skipped tests do not apply or were skipped")
    out.append(" by pymongo's runner, e.g. runOnRequirements for sharded clusters)")
    if run.engine.alive_at_end is False:
        out.append("THE ENGINE WAS NOT RUNNING AT THE END OF THE RUN: " + run.engine.log_tail)
    return "\n".join(out)


def _row(name: str, c: collections.Counter[str]) -> str:
    applicable = c["passed"] + c["failed"] + c["error"] + c["xpassed"]
    rate = f"{100 * c['passed'] / applicable:.1f}%" if applicable else "-"
    return (
        f"{name:<32} {c['passed']:>7} {c['failed']:>7} {c['error']:>7} "
        f"{c['skipped'] + c['xfailed']:>8} {applicable:>11} {rate:>10}"
    )


# -- the baseline --------------------------------------------------------------------------


def load_baseline(path: Path = BASELINE) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"suites": {}}


def write_baseline(run: SpecRun, path: Path = BASELINE) -> None:
    table = counts(run.results)
    doc = {
        "about": (
            "Tests of pymongo's spec suites that pass on the embedded engine. "
            "tests/external/test_pymongo_spec.py fails when a suite passes fewer than "
            "'passed'; raise with: python -m tests.external.pymongo_spec --write-baseline"
        ),
        "pymongo": run.version,
        "suites": {
            suite: {
                "passed": table.get(suite, collections.Counter())["passed"],
                "passing": sorted(
                    r.nodeid for r in run.results if r.suite == suite and r.outcome == "passed"
                ),
            }
            for suite in run.suites
        },
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")


def below_baseline(run: SpecRun, baseline: dict[str, Any]) -> list[str]:
    """One line per suite that passes fewer tests than its baseline (naming what broke)."""
    table = counts(run.results)
    now_passing = {r.nodeid for r in run.results if r.outcome == "passed"}
    lines = []
    for suite in run.suites:
        base = baseline.get("suites", {}).get(suite)
        if base is None:
            continue
        passed = table.get(suite, collections.Counter())["passed"]
        if passed < base["passed"]:
            lost = [n for n in base.get("passing", []) if n not in now_passing]
            lines.append(
                f"{suite}: {passed} passed, baseline {base['passed']}; no longer passing: "
                + ", ".join(lost[:8])
                + (" ..." if len(lost) > 8 else "")
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.external.pymongo_spec", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--suites", default=",".join(SUITES), help="comma-separated suites")
    parser.add_argument("-k", dest="select", help="pytest -k expression to run a subset")
    parser.add_argument("--echo", action="store_true", help="stream pytest's output")
    parser.add_argument("--causes", type=int, default=25, help="how many failure causes to list")
    parser.add_argument(
        "--write-baseline",
        action="store_true",
        help=f"rewrite {BASELINE.relative_to(REPO_ROOT)} from this run",
    )
    args = parser.parse_args(argv)
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    try:
        run = run_specs(suites, select=args.select, echo=args.echo)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(run))
    causes = failure_causes(run.results, args.causes)
    if causes:
        print(f"\nFailures by cause ({len(causes)} largest groups):")
        for text, n, where in causes:
            print(f"{n:>5}  {text}  [{', '.join(where)}]")
    for log in run.logs or (run.log,):
        print(f"\nlog: {log}")
    if args.write_baseline:
        if args.select or set(suites) != set(SUITES):
            print("error: --write-baseline needs a full run of every suite")
            return 2
        write_baseline(run)
        print(f"wrote {BASELINE.relative_to(REPO_ROOT)}")
        return 0
    lines = below_baseline(run, load_baseline())
    for line in lines:
        print(f"BELOW BASELINE: {line}")
    if run.engine.alive_at_end is False:
        return 1
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
