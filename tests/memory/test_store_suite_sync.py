"""LangGraph's store tests (its sdist's tests/test_store.py) against ``AccordStore`` (sync)
in place of InMemoryStore. Exclusions and their reasons: tests/memory/store_suite.py."""

from accord.memory.synchronous.store import AccordStore
from tests.memory import store_suite

globals().update(store_suite.load(AccordStore))
