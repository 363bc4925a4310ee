"""What the engine keeps in memory, and for how long (measured with tracemalloc: every
Python allocation, exactly)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from accord.platform.embedded.dispatch import Dispatcher
from accord.platform.embedded.engine import Engine

embedded_only = pytest.mark.embedded_only


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine(tmp_path, sync=False)
    try:
        yield eng
    finally:
        with eng.locked("shutdown"):
            eng.close()


def _run(dispatcher: Dispatcher, cmd: dict[str, Any]) -> None:
    reply = dispatcher.execute({**cmd, "$db": "t"})
    assert reply.get("ok") == 1 and not reply.get("writeErrors"), reply


@embedded_only
def test_a_dropped_collection_frees_its_versions_at_once(engine: Engine) -> None:
    """Versions kept for the snapshot-history window are freed when their collection is
    dropped (nobody can read them any more), not a window later."""
    engine.history_window = 300.0
    d = Dispatcher(engine, lambda cmd: {"ok": 1.0})
    big = "v" * (4 << 20)
    tracemalloc.start()
    try:
        _run(d, {"insert": "big", "documents": [{"_id": i, "v": big} for i in range(3)]})
        _run(d, {"update": "big", "updates": [{"q": {}, "u": {"$set": {"v": big + "2"}}, "multi": True}]})  # fmt: skip
        before = tracemalloc.get_traced_memory()[0]
        assert engine.gc_backlog() == 3  # the old versions wait for the history window
        _run(d, {"drop": "big"})
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert before - after > 5 * (4 << 20), (before, after)  # six versions of 4 MiB, freed
