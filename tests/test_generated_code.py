"""Generated sync modules are up to date with their async sources (``tools/synchro.py``)."""

from __future__ import annotations

import ast
import re

from tools import synchro

#: Sources whose sync twins the project relies on (a source moved out of an
#: ``asynchronous`` package would silently stop being generated and checked).
KNOWN_SOURCES = {
    "accord/checkpointers/asynchronous/saver.py",
    "accord/checkpointers/asynchronous/saver_core.py",
    "accord/checkpointers/asynchronous/saver_maintenance.py",
    "accord/checkpointers/asynchronous/saver_queue.py",
    "accord/checkpointers/asynchronous/saver_reads.py",
    "accord/checkpointers/asynchronous/saver_runs.py",
    "accord/checkpointers/asynchronous/saver_writes.py",
    "accord/memory/asynchronous/aggregator.py",
    "accord/memory/asynchronous/consolidation.py",
    "accord/memory/asynchronous/service.py",
    "accord/memory/asynchronous/store.py",
    "accord/platform/asynchronous/catalog.py",
    "accord/platform/asynchronous/leases.py",
    "accord/platform/asynchronous/unit_of_work.py",
}


def _relative(paths: list) -> set[str]:
    return {p.relative_to(synchro.ROOT).as_posix() for p in paths}


def test_every_async_source_has_a_current_sync_twin() -> None:
    assert synchro.sources(), "no async sources found"
    stale = synchro.stale()
    assert stale == [], f"stale generated modules (run `python -m tools.synchro`): {stale}"


def test_the_known_sources_are_generated() -> None:
    missing = KNOWN_SOURCES - _relative(synchro.sources())
    assert not missing, f"async sources no longer found by tools/synchro.py: {missing}"


def test_every_generated_module_has_its_source() -> None:
    """A generated module whose source was removed or renamed would never be checked
    again: each one must be the twin of a current source."""
    generated = [
        p
        for p in synchro.PACKAGE.rglob("synchronous/*.py")
        if p.name != "__init__.py" and p.read_text(encoding="utf-8").startswith("# Generated from")
    ]
    assert generated, "no generated modules found"
    twins = {synchro.target_of(s) for s in synchro.sources()}
    orphans = _relative([p for p in generated if p not in twins])
    assert not orphans, f"generated modules without an async source: {orphans}"


def test_generated_docstrings_describe_the_sync_twin() -> None:
    """Docstrings are translated with the code: a generated module never describes
    itself with its async source's names (``AsyncAccordSaver``, ``AsyncMongoClient``)."""
    async_name = re.compile(r"\bAsync[A-Z]\w*")
    wrong: list[str] = []
    for path in synchro.PACKAGE.rglob("synchronous/*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node) or ""
                wrong += [f"{path.name}: {m}" for m in async_name.findall(doc)]
    assert not wrong, f"generated docstrings name async things: {wrong}"
