"""LangGraph's checkpointer-parametrized tests against accord's savers, in ``make test``.

One run of the suite (``tests.external.langgraph_suite``) for InMemorySaver (the reference),
AccordSaver (sync fixture and its a* methods in the async fixture) and AsyncAccordSaver,
then the contract: every test InMemorySaver passes, each accord saver passes, except the
tests in ``langgraph_known_failures.txt``. A failure NOT in that list fails here, and so does
a listed test that passes (delete its line: the list only shrinks). See
docs/external-suites.md.
"""

from __future__ import annotations

import collections

import pytest

from tests.external import langgraph_suite as suite

pytestmark = [pytest.mark.external, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def run() -> suite.SuiteRun:
    result = suite.run_suite(suite.CONTRACT_SAVERS)
    print("\n" + suite.format_table(result))
    return result


@pytest.fixture(scope="module")
def known() -> suite.Known:
    return suite.load_known_failures()


def test_every_saver_ran_the_same_tests(run: suite.SuiteRun) -> None:
    keys: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for r in run.results:
        keys[(r.kind, r.saver)].update(r.keys)
    for kind in ("sync", "async"):
        reference = [r for r in run.results if (r.kind, r.saver) == (kind, suite.REFERENCE)]
        # A harness that collected nothing must not pass: the suite has hundreds per kind.
        assert len(reference) > 200, f"only {len(reference)} {kind} tests ran for memory"
        for (k, saver), theirs in keys.items():
            if k == kind and saver != suite.REFERENCE:
                missing = [r.nodeid for r in reference if not theirs.intersection(r.keys)]
                assert not missing, f"{saver} ({kind}) did not run {missing[:5]}"


@pytest.mark.parametrize(("kind", "saver"), suite.CONTRACT, ids=lambda v: str(v))
def test_accord_passes_what_inmemorysaver_passes(
    run: suite.SuiteRun, known: suite.Known, kind: str, saver: str
) -> None:
    mine = [r for r in run.results if (r.kind, r.saver) == (kind, saver)]
    new, fixed = suite.compare_known(mine + _reference(run, kind), known)
    lines = [f"NEW FAILURE {r.nodeid}: {suite.cause(r)} -- {r.message[:200]}" for r in new]
    lines += [f"NOW PASSES, delete it from {suite.KNOWN_FAILURES.name}: {n}" for n in fixed]
    assert not lines, f"{suite.LABELS[saver]} ({kind}_checkpointer):\n" + "\n".join(lines)


def test_known_failures_name_tests_that_exist(run: suite.SuiteRun, known: suite.Known) -> None:
    ran = {r.nodeid for r in run.results}
    functions = {n.split("[", 1)[0] for n in ran}
    stale = sorted(n for n in known.failing if n not in ran)
    stale += sorted(n for n in known.flaky if n not in functions)
    assert not stale, f"{suite.KNOWN_FAILURES.name} lists tests that did not run: {stale[:10]}"


def _reference(run: suite.SuiteRun, kind: str) -> list[suite.Result]:
    return [r for r in run.results if (r.kind, r.saver) == (kind, suite.REFERENCE)]
