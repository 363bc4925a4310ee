"""The LangGraph store refuses what it cannot serve with accord's ``InvalidInputError``
naming the field, never a raw exception, and writes nothing (issue 22, item 7): values
that are not JSON MongoDB stores exactly, keys ``get()`` would refuse, filters and values
nested too deep, TTLs that are not positive finite minutes; ``search(limit=0)`` is empty,
as with LangGraph's InMemoryStore. Both twins (``AccordStore``, ``AsyncAccordStore``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from langgraph.store.memory import InMemoryStore
from pymongo import AsyncMongoClient, MongoClient

from accord.errors import InvalidInputError
from accord.memory.asynchronous.store import AsyncAccordStore
from accord.memory.synchronous.store import AccordStore


def deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"x": 1}
    for _ in range(levels):
        node = {"n": node}
    return node


#: value -> the field the refusal must name and a fragment of its reason
BAD_VALUES: list[tuple[Any, str, str]] = [
    ({"when": dt.datetime(2026, 1, 1)}, "value.when", "datetime.datetime cannot be stored"),
    ({"raw": b"\x00\x01"}, "value.raw", "bytes cannot be stored"),
    ({"tags": {"a", "b"}}, "value.tags", "set cannot be stored"),
    ({"price": Decimal("1.10")}, "value.price", "decimal.Decimal cannot be stored"),
    ({"id": uuid.UUID(int=1)}, "value.id", "uuid.UUID cannot be stored"),
    ({"n": 2**64}, "value.n", "64 bits"),
    ({"n": -(2**63) - 1}, "value.n", "64 bits"),
    ({"x": float("nan")}, "value.x", "finite"),
    ({"x": [1.0, float("inf")]}, "value.x[1]", "finite"),
    ({"s": "\ud800"}, "value.s", "lone surrogate"),
    ({"\ud800": 1}, "value", "lone surrogate"),
    ({"a\x00b": 1}, "value", "NUL"),
    ({1: "int key"}, "value", "field names are strings"),
    ({"obj": object()}, "value.obj", "cannot be stored"),
    (deep(40), "value.n.n", "nested more than 32 levels"),
    (deep(1_000), "value.n.n", "nested more than 32 levels"),
    ({"big": "x" * (3 * 1024 * 1024)}, "value", "larger than 2,097,152 bytes"),
]  # fmt: skip

BAD_KEYS: list[tuple[Any, str]] = [
    ("a\x00b", "without NUL"),
    ("k" * 1025, "at most 1024"),
    ("\udcff", "lone surrogate"),
]  # (a key that is not a string is LangGraph's to convert: BaseStore.put takes str(key))

BAD_TTLS: list[tuple[Any, str]] = [
    (0, "> 0"), (-5, "> 0"), ("5", "must be a number, got a string"),
    (True, "must be a number, got a boolean"), (float("nan"), "finite"),
    (float("inf"), "finite"), (1e12, "<= 5.256e+06"),
]  # fmt: skip


class Twin:
    """The sync store as it is, or the async one driven from sync test code."""

    def __init__(self, flavor: str, uri: str) -> None:
        self.flavor = flavor
        self.db = "store_" + uuid.uuid4().hex[:10]
        self.loop = asyncio.new_event_loop()
        if flavor == "sync":
            self.client: Any = MongoClient(uri)
            self.store: Any = AccordStore(
                self.client, db_name=self.db, ttl={"refresh_on_read": True}
            )
            self.store.setup()
        else:
            self.client = self.loop.run_until_complete(self._aclient(uri))
            self.store = AsyncAccordStore(
                self.client, db_name=self.db, ttl={"refresh_on_read": True}
            )
            self.loop.run_until_complete(self.store.setup())

    async def _aclient(self, uri: str) -> AsyncMongoClient[Any]:
        return AsyncMongoClient(uri)

    def __getattr__(self, name: str) -> Any:
        if self.flavor == "sync":
            return getattr(self.store, name)
        method = getattr(self.store, "a" + name)
        return lambda *a, **k: self.loop.run_until_complete(method(*a, **k))

    def close(self, sync_client: MongoClient) -> None:
        if self.flavor == "sync":
            self.client.close()
        else:
            self.loop.run_until_complete(self.client.close())
        self.loop.close()
        sync_client.drop_database(self.db)


@pytest.fixture(params=["sync", "async"])
def store(request: pytest.FixtureRequest, mongo_uri: str, client: MongoClient) -> Iterator[Twin]:
    twin = Twin(request.param, mongo_uri)
    try:
        yield twin
    finally:
        twin.close(client)


def refused(call: Any, field: str, fragment: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        call()
    message = str(caught.value)
    assert message.startswith(field), message
    assert fragment in message, message
    assert len(message) < 600, message  # never the input echoed whole


@pytest.mark.parametrize(("value", "field", "fragment"), BAD_VALUES)
def test_values_that_cannot_be_stored_exactly(store: Twin, value: Any, field: str,
                                              fragment: str) -> None:  # fmt: skip
    refused(lambda: store.put(("ns",), "k", value), field, fragment)
    refused(lambda: store.put(("ns",), "k", value, index=False), field, fragment)
    assert store.get(("ns",), "k") is None  # nothing written


@pytest.mark.parametrize(("key", "fragment"), BAD_KEYS)
def test_the_same_key_rules_on_every_method(store: Twin, key: Any, fragment: str) -> None:
    """put() used to take keys that get() refused (and search returned them)."""
    refused(lambda: store.put(("ns",), key, {"v": 1}), "key", fragment)
    refused(lambda: store.get(("ns",), key), "key", fragment)
    refused(lambda: store.delete(("ns",), key), "key", fragment)
    assert store.search(("ns",)) == []


@pytest.mark.parametrize(("ttl", "fragment"), BAD_TTLS)
def test_ttls_are_positive_finite_minutes(store: Twin, ttl: Any, fragment: str) -> None:
    """Zero or negative made the write vanish at once; "5" and True were taken as
    minutes; NaN, inf and 1e12 raised ValueError/OverflowError."""
    refused(lambda: store.put(("ns",), "k", {"v": 1}, ttl=ttl), "ttl", fragment)
    assert store.get(("ns",), "k") is None


def test_a_bad_default_ttl_is_refused_when_the_store_is_made(client: MongoClient) -> None:
    with pytest.raises(InvalidInputError, match="ttl.default_ttl"):
        AccordStore(client, ttl={"default_ttl": -1})


@pytest.mark.parametrize(
    ("filt", "fragment"),
    [
        ({"a": deep(40)}, "nested more than 32 levels"),
        ({"a": deep(2_000)}, "nested more than 32 levels"),
        ({"$or": []}, "not allowed"),
        ({"a": {"$in": "x"}}, "needs a list"),
        ({"a": {"$eq": float("nan")}}, "finite"),
        ("{}", "a filter is an object"),
    ],
)
def test_bad_filters(store: Twin, filt: Any, fragment: str) -> None:
    refused(lambda: store.search(("ns",), filter=filt), "filter", fragment)


@pytest.mark.parametrize(("limit", "offset", "field"), [("3", 0, "limit"), (True, 0, "limit"),
                                                        (-1, 0, "limit"), (2, "1", "offset")])  # fmt: skip
def test_pages_are_integers(store: Twin, limit: Any, offset: Any, field: str) -> None:
    refused(lambda: store.search(("ns",), limit=limit, offset=offset), field, "integer" if
            isinstance(limit if field == "limit" else offset, str | bool) else "at least 0")  # fmt: skip


@pytest.mark.parametrize(("index", "field"), [([1], "index[0]"), (["a", b"t"], "index[1]")])
def test_index_paths_are_strings(store: Twin, index: Any, field: str) -> None:
    """A TypeError from LangGraph's path tokenizer before."""
    refused(lambda: store.put(("ns",), "k", {"a": "x"}, index=index), field, "a string")


def test_a_huge_integer_is_named_by_its_size(store: Twin) -> None:
    """Quoting it raised ValueError (Python's 4,300-digit limit on ``str(int)``)."""
    for kwargs in ({"offset": -(10**5000)}, {"limit": -(10**5000)}):
        refused(lambda kw=kwargs: store.search(("ns",), **kw), next(iter(kwargs)), "digits")  # type: ignore[misc]


def test_search_limit_zero_is_empty_as_in_memory_store(store: Twin) -> None:
    reference = InMemoryStore()
    for s in (reference, store):
        s.put(("ns",), "a", {"v": 1})
        s.put(("ns",), "b", {"v": 2})
    for query in (None, "v"):
        assert reference.search(("ns",), query=query, limit=0) == []
        assert store.search(("ns",), query=query, limit=0) == []
    assert len(store.search(("ns",), limit=1)) == 1


def test_good_values_still_read_back_exactly(store: Twin) -> None:
    value = {"s": "ü ✓ \U0001f600", "i": 2**63 - 1, "neg": -(2**63), "f": 1.5, "b": True,
             "n": None, "l": [1, "two", [3.0]], "d": deep(30), "$dollar": "ok", "a.b": "ok"}  # fmt: skip
    store.put(("ns",), "good", value)
    assert store.get(("ns",), "good").value == value


def test_list_namespaces_holds_every_match_condition_as_in_memory_store(store: Twin) -> None:
    """Before: only the last prefix (and the last suffix) counted, so an application's own
    scope (prefix ("users", uid)) and a caller's condition gave the caller's scope."""
    from langgraph.store.base import ListNamespacesOp, MatchCondition

    reference = InMemoryStore()
    spaces = [("users", "alice", "notes"), ("users", "bob", "notes"), ("users", "bob", "todo"),
              ("teams", "bob", "notes"), ("users", "alice")]  # fmt: skip
    for s in (reference, store):
        for ns in spaces:
            s.put(ns, "k", {"v": 1})
    cases: list[tuple[tuple[str, tuple[str, ...]], ...]] = [
        (("prefix", ("users", "alice")), ("prefix", ("users", "bob"))),
        (("prefix", ("users", "bob")), ("prefix", ("users",))),
        (("prefix", ("*", "bob")), ("prefix", ("users", "*", "notes"))),
        (("prefix", ("users",)), ("suffix", ("notes",)), ("suffix", ("bob", "*"))),
        (("suffix", ("notes",)), ("suffix", ("todo",))),
        (("suffix", ("alice", "notes")), ("suffix", ("*", "*", "notes"))),
        (("prefix", ()), ("suffix", ())),
    ]  # fmt: skip
    for conds in cases:
        op = ListNamespacesOp(
            match_conditions=tuple(MatchCondition(kind, path) for kind, path in conds),  # type: ignore[arg-type]
            limit=10, offset=0,
        )  # fmt: skip
        expected = reference.batch([op])[0]
        assert sorted(store.batch([op])[0]) == sorted(expected), conds
    assert store.batch([ListNamespacesOp(match_conditions=(
        MatchCondition("prefix", ("users", "alice")), MatchCondition("prefix", ("users", "bob")),
    ), limit=10, offset=0)])[0] == []  # fmt: skip
    with pytest.raises(InvalidInputError, match="limit"):  # refused as before, even then
        store.batch([ListNamespacesOp(match_conditions=(
            MatchCondition("prefix", ("a",)), MatchCondition("prefix", ("b",)),
        ), limit=-1, offset=0)])  # fmt: skip


def test_accords_own_embedder_object_serves_a_store_index(client: MongoClient) -> None:
    """``index={"embed": HashingEmbedder()}`` was taken by LangGraph's ensure_embeddings
    for a function: the first put failed with "'HashingEmbedder' object is not callable"."""
    from accord.memory.embedders import HashingEmbedder

    db = "store_" + uuid.uuid4().hex[:10]
    try:
        store = AccordStore(client, db_name=db, index={"dims": 64, "embed": HashingEmbedder(64)})
        store.setup()
        store.put(("ns",), "tea", {"text": "green tea with lemon"})
        store.put(("ns",), "car", {"text": "a red sports car"})
        (best, *_) = store.search(("ns",), query="which tea")
        assert best.key == "tea"
        with pytest.raises(
            InvalidInputError, match="'dims' is 32, its embedder makes vectors of 64"
        ):
            AccordStore(client, db_name=db, index={"dims": 32, "embed": HashingEmbedder(64)})
    finally:
        client.drop_database(db)


def test_a_put_request_without_provenance_is_refused(client: MongoClient) -> None:
    """``provenance=None`` raised AttributeError from deep in the write."""
    from accord.memory.model import PutRequest
    from accord.memory.synchronous.service import MemoryService

    db = "store_" + uuid.uuid4().hex[:10]
    try:
        service = MemoryService(client, db_name=db)
        service.setup()
        bad = PutRequest(("ns",), "k", {"a": 1}, text="x", provenance=None)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="provenance: must be a Provenance"):
            service.apply([bad])
        assert client[db].long_term_memory.count_documents({}) == 0
    finally:
        client.drop_database(db)
