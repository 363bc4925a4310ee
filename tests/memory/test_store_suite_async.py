"""LangGraph's store tests (its sdist's tests/test_store.py) against ``AsyncAccordStore``
(native async) in place of InMemoryStore. Exclusions and their reasons:
tests/memory/store_suite.py."""

from accord.memory.asynchronous.store import AsyncAccordStore
from tests.memory import store_suite

globals().update(store_suite.load(AsyncAccordStore))
