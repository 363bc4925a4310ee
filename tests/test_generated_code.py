"""Generated sync modules are up to date with their async sources (``tools/synchro.py``)."""

from __future__ import annotations

from tools import synchro


def test_every_async_source_has_a_current_sync_twin() -> None:
    assert synchro.sources(), "no async sources found"
    stale = synchro.stale()
    assert stale == [], f"stale generated modules (run `python -m tools.synchro`): {stale}"
