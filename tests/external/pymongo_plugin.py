"""pytest plugin for pymongo's own test tree, run against accord's embedded engine.

The harness (``tests/external/pymongo_spec.py``) copies it next to pymongo's ``test/`` and
loads it with ``-p accord_spec_plugin``. It changes nothing in how pymongo's runner runs a
test; it only records, into the JSON file named by ``ACCORD_SPEC_RESULTS``, one record per
test: node id, the spec suite it belongs to, its outcome and the failure's message.

A test's threads still running when it ends are waited for (up to
:data:`LEFT_THREADS_TIMEOUT_S`) in its own teardown: a failing prose test that stops
joining its threads (``test_scram_threaded`` asserts after the first join) would
otherwise see them crash during a later test, which pytest then fails instead (seen
under load: ``TestAuthURIOptions::test_uri_options``).

A unified-format test's suite is the directory of its spec file (``TEST_PATH``: ``crud``,
``transactions``, ``transactions-convenient-api``, ...); a prose test's is its module.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_records: dict[str, dict[str, Any]] = {}
#: How long a test's teardown waits for the threads it left running.
LEFT_THREADS_TIMEOUT_S = 30.0
_BEFORE = pytest.StashKey[set[threading.Thread]]()


def _suite(item: pytest.Item) -> str:
    test_path = getattr(getattr(item, "cls", None), "TEST_PATH", None)
    if isinstance(test_path, str):
        parts = Path(test_path).parts
        if "test" in parts:
            return parts[parts.index("test") + 1]
    module = item.nodeid.split("::", 1)[0]
    return f"{Path(module).stem} (prose)"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        _records[item.nodeid] = {"nodeid": item.nodeid, "suite": _suite(item)}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    item.stash[_BEFORE] = set(threading.enumerate())
    yield


@pytest.hookimpl(tryfirst=True)  # before pytest's own (trylast) collects thread errors
def pytest_runtest_teardown(item: pytest.Item) -> None:
    before = item.stash.get(_BEFORE, set())
    for thread in set(threading.enumerate()) - before:
        if not thread.daemon:
            thread.join(LEFT_THREADS_TIMEOUT_S)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record = _records.get(report.nodeid)
    if record is None:
        return
    record["duration"] = record.get("duration", 0.0) + report.duration
    if hasattr(report, "wasxfail"):
        outcome: str | None = "xpassed" if report.passed else "xfailed"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    else:
        outcome = "passed" if report.when == "call" else None
    if outcome is None or record.get("outcome") in ("failed", "error"):
        return
    record["outcome"] = outcome
    if outcome in ("failed", "error", "skipped"):
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            text = str(crash.message)
        elif isinstance(report.longrepr, tuple):
            text = str(report.longrepr[2])
        else:
            text = str(report.longrepr)
        record["message"] = " ".join(text.split())[:600]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("ACCORD_SPEC_RESULTS")
    if path:
        records = [r for r in _records.values() if "outcome" in r]
        Path(path).write_text(json.dumps(records, indent=1))
