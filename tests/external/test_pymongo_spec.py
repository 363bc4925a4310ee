"""pymongo's spec tests against the embedded engine, in ``make test``: no suite may pass fewer
tests than ``pymongo_spec_baseline.json`` records, and the engine must stay up throughout.

Runs the same thing as ``make spec`` (``tests.external.pymongo_spec``). When engine work
makes more tests pass, raise the baseline (``make spec ARGS=--write-baseline``) in the same
commit, so a later regression is caught. See docs/external-suites.md.
"""

from __future__ import annotations

import pytest

from tests.external import pymongo_spec as spec

pytestmark = [pytest.mark.external, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def run() -> spec.SpecRun:
    result = spec.run_specs()
    print("\n" + spec.format_table(result))
    return result


def test_engine_stayed_up(run: spec.SpecRun) -> None:
    assert run.engine.alive_at_end is not False, (
        f"the engine died during the spec tests:\n{run.engine.log_tail}"
    )


def test_every_suite_ran(run: spec.SpecRun) -> None:
    table = spec.counts(run.results)
    empty = [s for s in spec.SUITES if not sum(table.get(s, {}).values())]
    assert not empty, f"no tests ran for {empty}; see {run.log}"


def test_no_suite_below_its_baseline(run: spec.SpecRun) -> None:
    baseline = spec.load_baseline()
    assert baseline["suites"], f"{spec.BASELINE.name} is missing or empty"
    lines = spec.below_baseline(run, baseline)
    assert not lines, "\n".join(lines) + f"\n(log: {run.log})"
