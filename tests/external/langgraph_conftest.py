"""conftest.py for LangGraph's own test suite, run with accord's savers added.

The harness (``tests/external/langgraph_suite.py``) copies the ``tests/`` of the installed
langgraph's sdist into a run directory, renames the suite's ``conftest.py`` to
``conftest_upstream.py`` (unchanged) and drops this file in as ``conftest.py``. Every
fixture and hook of the upstream conftest is re-exported as is; only the two checkpointer
fixtures are redefined, with the savers chosen by ``ACCORD_LG_SAVERS``:

- ``memory``: the suite's own InMemorySaver (``MemorySaverAssertImmutable``), the reference;
- ``mongodb``: langgraph-checkpoint-mongodb's ``MongoDBSaver`` (the saver users migrate from);
- ``accord``: :class:`accord.checkpointers.AccordSaver`;
- ``accord_async``: :class:`accord.checkpointers.AsyncAccordSaver` (async fixture only);
- any other upstream name (``sqlite``, ``sqlite_aes``, ``memory_migrate_sends``,
  ``sqlite_aio``): the suite's ``_checkpointer_<name>`` helper.

Every MongoDB-backed saver gets a fresh database per test on ONE server for the session:
``ACCORD_LG_MONGODB_URI`` (set by the harness, which starts one embedded engine), else
``MONGODB_URI``, else an embedded engine started here on a temporary directory.

Only the checkpointer-parametrized tests are kept (``ACCORD_LG_ALL_TESTS=1`` keeps the
rest too). ``ACCORD_LG_RESULTS`` names a JSON file that receives one record per test:
node id, fixture kind, saver, outcome, a key shared by the same test under every saver,
and the failure's one-line message.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests import conftest_checkpointer as upstream_helpers
from tests.conftest_upstream import *  # noqa: F403  (every upstream fixture and hook)

CP_ARGS = ("sync_checkpointer", "async_checkpointer")
ACCORD_SAVERS = {"mongodb", "accord", "accord_async"}
DEFAULT_SAVERS = (
    "sync:memory,sync:mongodb,sync:accord,async:memory,async:mongodb,async:accord_async"
)


def _selected(kind: str) -> list[str]:
    spec = os.environ.get("ACCORD_LG_SAVERS", DEFAULT_SAVERS)
    names = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        entry_kind, _, name = entry.partition(":")
        if entry_kind not in ("sync", "async") or not name:
            raise pytest.UsageError(
                f"ACCORD_LG_SAVERS entry {entry!r} is not 'sync:NAME' or 'async:NAME'"
            )
        if entry_kind == kind:
            names.append(name)
    return names


# -- one MongoDB server for the session --------------------------------------------------

_server: dict[str, Any] = {}


def _mongo_uri() -> str:
    uri = os.environ.get("ACCORD_LG_MONGODB_URI") or os.environ.get("MONGODB_URI")
    if uri:
        return uri
    if "uri" not in _server:
        from accord.platform import ensure_engine

        data_dir = Path(tempfile.mkdtemp(prefix="accord-lg-engine-"))
        _server["dir"] = data_dir
        _server["uri"] = ensure_engine(data_dir, sync=False)
    return str(_server["uri"])


def _sync_client() -> Any:
    if "client" not in _server:
        from pymongo import MongoClient

        _server["client"] = MongoClient(_mongo_uri())
    return _server["client"]


def pytest_unconfigure(config: pytest.Config) -> None:
    client = _server.pop("client", None)
    if client is not None:
        client.close()
    data_dir = _server.pop("dir", None)
    if data_dir is not None:
        from accord.platform import stop_engine

        stop_engine(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def _fresh_db() -> str:
    # not uuid4(): tests that make uuid4 deterministic (``deterministic_uuids``) may have
    # patched it already when this fixture runs, and must see the same ids as under
    # InMemorySaver
    return "lg_" + secrets.token_hex(8)


# -- the savers ---------------------------------------------------------------------------


@contextmanager
def _sync_saver(name: str) -> Iterator[Any]:
    if name not in ACCORD_SAVERS:
        with _upstream(name) as saver:
            yield saver
        return
    client = _sync_client()
    db_name = _fresh_db()
    try:
        if name == "mongodb":
            from langgraph.checkpoint.mongodb import MongoDBSaver

            saver = MongoDBSaver(client, db_name=db_name)
        elif name == "accord":
            from accord.checkpointers import AccordSaver

            saver = AccordSaver(client, db_name=db_name)
            saver.setup()
        else:
            raise pytest.UsageError(f"{name} is an async saver; use it as async:{name}")
        upstream_helpers._apply_strict_msgpack(saver)
        yield saver
    finally:
        client.drop_database(db_name)


@asynccontextmanager
async def _async_saver(name: str) -> AsyncIterator[Any]:
    if name != "accord_async":
        # memory, mongodb and accord serve the async API on their sync class.
        if name in ACCORD_SAVERS or not hasattr(upstream_helpers, f"_checkpointer_{name}"):
            with _sync_saver(name) as saver:
                yield saver
        else:
            async with _upstream_async(name) as saver:
                yield saver
        return
    from pymongo import AsyncMongoClient

    from accord.checkpointers import AsyncAccordSaver

    client: AsyncMongoClient[Any] = AsyncMongoClient(_mongo_uri())
    db_name = _fresh_db()
    try:
        saver = AsyncAccordSaver(client, db_name=db_name)
        await saver.setup()
        upstream_helpers._apply_strict_msgpack(saver)
        yield saver
    finally:
        await client.drop_database(db_name)
        await client.close()


def _helper(name: str) -> Any:
    helper = getattr(upstream_helpers, f"_checkpointer_{name}", None)
    if helper is None:
        raise pytest.UsageError(
            f"unknown saver {name!r}: not one of {sorted(ACCORD_SAVERS | {'memory'})} "
            "nor an upstream tests.conftest_checkpointer._checkpointer_<name>"
        )
    return helper


@contextmanager
def _upstream(name: str) -> Iterator[Any]:
    helper = _helper(name)
    if inspect.isasyncgenfunction(getattr(helper, "__wrapped__", helper)):
        raise pytest.UsageError(f"{name} is an async saver; use it as async:{name}")
    with helper() as saver:
        yield saver


@asynccontextmanager
async def _upstream_async(name: str) -> AsyncIterator[Any]:
    cm = _helper(name)()
    if hasattr(cm, "__aenter__"):
        async with cm as saver:
            yield saver
    else:
        with cm as saver:
            yield saver


# -- the fixtures the suite's tests ask for ----------------------------------------------


@pytest.fixture(scope="function", params=_selected("sync"))
def sync_checkpointer(request: pytest.FixtureRequest) -> Iterator[Any]:
    with _sync_saver(request.param) as saver:
        yield saver


@pytest.fixture(scope="function", params=_selected("async"))
async def async_checkpointer(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    async with _async_saver(request.param) as saver:
        yield saver


# -- selection and the results file -------------------------------------------------------


def _cp(item: pytest.Item) -> tuple[str, str] | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for arg in CP_ARGS:
        value = callspec.params.get(arg)
        if isinstance(value, str):  # not pytest's NOTSET for an empty saver list
            return ("sync" if arg == CP_ARGS[0] else "async"), value
    return None


def _keys(item: pytest.Item, saver: str) -> list[str]:
    """Names of the same test under every saver: the node id with the saver's id as ``*``.

    A test's id joins its parameters' ids with ``-``; the saver's id is its name. When
    another parameter has the same id (the ``cache`` fixture's ``memory``), every
    position is a candidate: the savers' variants share exactly one of them.
    """
    base, _, rest = item.nodeid.partition("[")
    tokens = rest[:-1].split("-") if rest else []
    return [
        f"{base}[{'-'.join([*tokens[:i], '*', *tokens[i + 1 :]])}]"
        for i, token in enumerate(tokens)
        if token == saver
    ]


_items: dict[str, dict[str, Any]] = {}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep_all = os.environ.get("ACCORD_LG_ALL_TESTS") == "1"
    selected, deselected = [], []
    for item in items:
        cp = _cp(item)
        if cp is None and not keep_all:
            deselected.append(item)
            continue
        selected.append(item)
        record: dict[str, Any] = {"nodeid": item.nodeid, "kind": None, "saver": None}
        if cp is not None:
            record.update(kind=cp[0], saver=cp[1], keys=_keys(item, cp[1]))
        _items[item.nodeid] = record
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record = _items.get(report.nodeid)
    if record is None:
        return
    record.setdefault("duration", 0.0)
    record["duration"] += report.duration
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.passed else "xfailed"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    else:
        outcome = "passed" if report.when == "call" else None
    if outcome is None or record.get("outcome") in ("failed", "error"):
        return  # setup/teardown passed, or an earlier phase already failed
    if outcome == "error" and record.get("outcome") == "passed":
        outcome = "error"  # a teardown failure after a passed call
    record["outcome"] = outcome
    if outcome in ("failed", "error", "skipped"):
        record["message"] = _message(report)
        if outcome != "skipped":
            record["details"] = _details(report)


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = str(crash.message)
    elif isinstance(report.longrepr, tuple):  # skip: (path, line, reason)
        text = str(report.longrepr[2])
    else:
        text = str(report.longrepr)
    return " ".join(text.split())[:400]


def _details(report: pytest.TestReport) -> str:
    """The ``E`` lines of the failure (exception and assertion diff), for grouping causes."""
    lines = [ln for ln in str(report.longrepr).splitlines() if ln.startswith("E ")]
    return "\n".join(lines)[:6000]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("ACCORD_LG_RESULTS")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # under pytest-xdist each worker writes its own part
        path = f"{path}.{worker}"
    records = [r for r in _items.values() if "outcome" in r]
    Path(path).write_text(json.dumps(records, indent=1))
