"""Bad input: clear InvalidInputError before any query, nothing written."""

from __future__ import annotations

import re
from typing import Any

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from pymongo import MongoClient

from accord.checkpointers.storage import BUSINESS_CHANNEL
from accord.errors import InvalidInputError
from tests.checkpointers.conftest import config

BAD_IDS: list[Any] = [1, None, {"$ne": ""}, ["t"], b"t", "", "a\x00b", "x" * 2000]


def _total(client: MongoClient, db_name: str) -> int:
    """Documents of the database, but the catalog ``setup()`` wrote."""
    db = client[db_name]
    return sum(
        db[c].count_documents({}) for c in db.list_collection_names() if c != "accord_catalog"
    )


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_bad_thread_ids(client: MongoClient, saver: Any, bad: Any) -> None:
    cfg = {"configurable": {"thread_id": bad, "checkpoint_ns": ""}}
    cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
    for call in (
        lambda: saver.put(cfg, cp, generate_metadata(), {"v": "1"}),
        lambda: saver.put_writes(
            {"configurable": {**cfg["configurable"], "checkpoint_id": "c"}}, [("v", 1)], "t"
        ),
        lambda: saver.get_tuple(cfg),
        lambda: list(saver.list(cfg)),
        lambda: saver.delete_thread(bad),
        lambda: saver.copy_thread(bad, "x"),
        lambda: saver.copy_thread("x", bad),
        lambda: saver.prune([bad]),
    ):
        with pytest.raises(InvalidInputError):
            call()
    assert _total(client, saver.db_name) == 0


def test_operator_shaped_identifiers_never_widen_a_query(saver: Any) -> None:
    cp = generate_checkpoint(channel_values={"v": 1}, channel_versions={"v": "1"})
    stored = saver.put(config("real"), cp, generate_metadata(), {"v": "1"})
    for conf in (
        {"thread_id": {"$ne": ""}},
        {"thread_id": "real", "checkpoint_ns": {"$exists": True}},
        {"thread_id": "real", "checkpoint_ns": "", "checkpoint_id": {"$gt": ""}},
        {"thread_id": "real", "checkpoint_ns": "", "tenant_id": {"$ne": "x"}},
    ):
        with pytest.raises(InvalidInputError, match="must be a string"):
            saver.get_tuple({"configurable": conf})
    with pytest.raises(InvalidInputError):
        list(saver.list(config("real"), before={"configurable": {"checkpoint_id": {"$gt": ""}}}))
    assert saver.get_tuple(stored) is not None


@pytest.mark.parametrize(
    "bad_filter",
    [
        {"$where": "1"},
        {"source": {"$ne": "input"}},
        {"a.b": 1},
        {"": 1},
        {1: "x"},
        {"step": {"$gt": 1}},
        {"nested": {"ok": {"$in": [1]}}},
        {"source": object()},
        {"step": 2**64},
        "source=input",
    ],
    # repr, but the same in every process (pytest-xdist workers must collect equal ids)
    ids=lambda v: re.sub(r" at 0x[0-9a-f]+", "", repr(v)),
)
def test_metadata_filters_reject_operators(saver: Any, bad_filter: Any) -> None:
    with pytest.raises(InvalidInputError):
        list(saver.list(None, filter=bad_filter))


def test_nested_metadata_filters_match_by_containment(saver: Any) -> None:
    cp = generate_checkpoint()
    saver.put(config("n"), cp, generate_metadata(custom={"a": 1, "b": 2}), {})
    assert len(list(saver.list(None, filter={"custom": {"a": 1}}))) == 1
    assert len(list(saver.list(None, filter={"custom": {"a": 2}}))) == 0


def test_metadata_filters_do_not_look_into_arrays_as_inmemorysaver_does(saver: Any) -> None:
    """MongoDB's equality matches an element of an array; LangGraph's savers compare
    values: a scalar (or a dict) never equals a list."""
    from langgraph.checkpoint.memory import InMemorySaver

    meta = generate_metadata(tags=["x", "y"], arr=[{"b": 1}, {"b": 2}], deep={"l": [1, 2]})
    reference = InMemorySaver()
    for s in (saver, reference):
        s.put(config("arrays"), generate_checkpoint(), meta, {})
    for filt in (
        {"tags": "x"}, {"tags": ["x", "y"]}, {"tags": ["y", "x"]}, {"arr": {"b": 1}},
        {"deep": {"l": 1}}, {"deep": {"l": [1, 2]}}, {"arr": [{"b": 1}, {"b": 2}]},
    ):  # fmt: skip
        expected = len(list(reference.list(None, filter=filt)))
        assert len(list(saver.list(None, filter=filt))) == expected, filt


def test_other_bad_inputs(client: MongoClient, saver: Any) -> None:
    for limit in (-1, "10", 1.5, True):
        with pytest.raises(InvalidInputError, match="limit"):
            list(saver.list(config("t"), limit=limit))
    with pytest.raises(InvalidInputError, match="run_ids"):
        saver.delete_for_runs("run-1")
    with pytest.raises(InvalidInputError, match="strategy"):
        saver.prune(["t"], strategy="everything")
    cp = generate_checkpoint()
    with pytest.raises(InvalidInputError, match="task_id"):
        saver.put_writes(config("t", "c"), [("v", 1)], {"$ne": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="channel"):
        saver.put_writes(config("t", "c"), [(1, 1)], "task")  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="thread_id"):
        saver.put({"configurable": {}}, cp, generate_metadata(), {})
    with pytest.raises(InvalidInputError, match="checkpoint_id"):
        saver.put_writes(config("t"), [("v", 1)], "task")
    bad_cp = {**cp, "id": {"$gt": ""}}
    with pytest.raises(InvalidInputError):
        saver.put(config("t"), bad_cp, generate_metadata(), {})  # type: ignore[arg-type]
    assert _total(client, saver.db_name) == 0


def test_business_writes_cannot_target_checkpointer_collections(
    client: MongoClient, saver: Any
) -> None:
    from langgraph.graph import START, StateGraph

    from accord.checkpointers import business

    def node(state: dict[str, Any]) -> dict[str, Any]:
        business.insert_one("accord_checkpoints", {"x": 1})
        return {"n": 1}

    g = StateGraph(dict)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(InvalidInputError, match="one of accord's own collections"):
        g.compile(checkpointer=saver).invoke({"n": 0}, config("biz"))
    assert (
        client[saver.db_name].accord_checkpoints.count_documents({"thread_id": "biz", "x": 1}) == 0
    )


def test_a_task_recorded_twice_applies_its_business_writes_once(
    client: MongoClient, saver: Any, saver_factory: Any
) -> None:
    other = saver_factory(setup=False)  # another worker ran the same task
    cp = generate_checkpoint()
    stored = saver.put(config("twice"), cp, generate_metadata(), {})
    op = {
        "op": "insert_one",
        "collection": "orders",
        "document": {"_id": "o-1", "tenant_id": "default"},
    }
    writes = [(BUSINESS_CHANNEL, op), ("v", 1)]
    saver.put_writes(stored, writes, "task-1")
    other.put_writes(stored, writes, "task-1")  # no duplicate-key error, no second insert
    assert client[saver.db_name].orders.count_documents({}) == 1
    tup = saver.get_tuple(stored)
    assert tup is not None and [(w[1]) for w in tup.pending_writes] == [BUSINESS_CHANNEL, "v"]


@pytest.mark.parametrize(
    ("target", "refusal"),
    [
        # accord's collections that exist only once a feature is used (no catalog entry
        # before): a tenant could plant audit records or heads, cuts, hold fences
        ("accord_audit", "one of accord's own collections"),
        ("accord_audit_heads", "one of accord's own collections"),
        ("accord_audit_cuts", "one of accord's own collections"),
        ("accord_audit_digest_heads", "one of accord's own collections"),
        ("accord_hold_fences", "one of accord's own collections"),
        # MongoDB refuses it: a clear error in the node, not a raw DatabaseError at commit
        (".orders", "not a valid business collection name"),
        ("orders.", "not a valid business collection name"),
    ],
)
def test_business_writes_cannot_target_accord_collections_made_later(
    client: MongoClient, saver: Any, target: str, refusal: str
) -> None:
    from langgraph.graph import START, StateGraph

    from accord.checkpointers import business

    def node(state: dict[str, Any]) -> dict[str, Any]:
        business.insert_one(target, {"_id": "planted", "x": 1})
        return {"n": 1}

    g = StateGraph(dict)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(InvalidInputError, match=refusal):
        g.compile(checkpointer=saver).invoke({"n": 0}, config("biz"))
    assert target not in client[saver.db_name].list_collection_names()


@pytest.mark.parametrize(
    ("filt", "update", "upsert"),
    [
        ({"_id": "o"}, {"$inc": 5}, False),
        ({"_id": "o"}, {"$inc": "tenant_id"}, False),
        ({"sku": "A-1"}, {"$setOnInsert": ["tenant_id"], "$set": {"qty": 1}}, True),
    ],
    ids=["inc-not-a-document", "inc-naming-a-field", "setOnInsert-not-a-document"],
)
def test_an_update_operator_that_is_not_a_document_is_refused_not_dropped(
    client: MongoClient, saver: Any, filt: Any, update: Any, upsert: bool
) -> None:
    """accord's _version bump rebuilds $inc (and an upsert's $setOnInsert): an operator
    given as a non-document was silently replaced, the write committing without it."""
    from langgraph.graph import START, StateGraph

    from accord.checkpointers import business

    client[saver.db_name].orders.insert_one({"_id": "o", "tenant_id": "default", "qty": 1})

    def node(state: dict[str, Any]) -> dict[str, Any]:
        business.update_one("orders", filt, update, upsert=upsert)
        return {"n": 1}

    g = StateGraph(dict)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(InvalidInputError, match="takes a document of field paths"):
        g.compile(checkpointer=saver).invoke({"n": 0}, config("biz"))
    assert list(client[saver.db_name].orders.find()) == [
        {"_id": "o", "tenant_id": "default", "qty": 1}
    ]


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.delete_one("orders", {"$where": "sleep(5000) || true"}),
        lambda b: b.update_one("orders", {"$and": [{"$where": "true"}]}, {"$set": {"x": 1}}),
        lambda b: b.update_one(
            "orders", {"_id": "o"},
            [{"$set": {"x": {"$function": {"body": "function() { return 1 }", "args": [],
                                           "lang": "js"}}}}],
        ),
    ],
    ids=["where", "nested-where", "function-in-pipeline"],
)  # fmt: skip
def test_business_writes_run_no_server_side_javascript(
    client: MongoClient, saver: Any, call: Any
) -> None:
    """Before: accepted when staged; MongoDB ran the tenant's JavaScript in the step's
    transaction (the embedded engine failed it at commit with a DatabaseError)."""
    from langgraph.graph import START, StateGraph

    from accord.checkpointers import business

    client[saver.db_name].orders.insert_one({"_id": "o", "tenant_id": "default"})

    def node(state: dict[str, Any]) -> dict[str, Any]:
        call(business)
        return {"n": 1}

    g = StateGraph(dict)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(InvalidInputError, match="server-side JavaScript"):
        g.compile(checkpointer=saver).invoke({"n": 0}, config("biz"))
    assert list(client[saver.db_name].orders.find()) == [{"_id": "o", "tenant_id": "default"}]


def _nested(levels: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"x": 1}
    for _ in range(levels):
        doc = {"a": doc}
    return doc


class _NotBson:
    """A value BSON has no type for."""


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda b: b.insert_one("orders", {"_id": "p", **_nested(5000)}), "nested more than"),
        (lambda b: b.update_one("orders", {"_id": "p"}, {"$set": _nested(5000)}),
         "nested more than"),
        (lambda b: b.insert_one("orders", {"_id": "p", "x": _NotBson()}), "cannot be stored"),
        (lambda b: b.insert_one("orders", {"_id": "p", 1: "x"}), "only string keys"),
        (lambda b: b.delete_one("orders", {b"k": 1}), "only string keys"),
        (lambda b: b.append_event("w", {"x": _NotBson()}), "cannot be stored"),
        # before: a raw UnicodeEncodeError from the node, or the task failing at commit
        (lambda b: b.insert_one("orders", {"_id": "p", "x": "\ud800"}), "lone surrogate"),
        (lambda b: b.insert_one("orders", {"_id": "p", "\ud800": 1}), "lone surrogate"),
        (lambda b: b.update_one("orders", {"_id": "\ud800"}, {"$set": {"x": 1}}),
         "lone surrogate"),
        (lambda b: b.insert_one("a\ud800", {"_id": "p"}), "collection holds a lone surrogate"),
    ],
    ids=["deep-insert", "deep-update", "no-bson-type", "int-key", "bytes-key-filter", "event",
         "surrogate-value", "surrogate-key", "surrogate-filter", "surrogate-collection"],
)  # fmt: skip
def test_business_input_mongodb_cannot_store_is_refused_when_staged(
    client: MongoClient, saver: Any, call: Any, words: str
) -> None:
    """Before: a RecursionError from the node (deep input), or the task failing at commit
    with 'an earlier save of this run failed with InvalidDocument'."""
    from langgraph.graph import START, StateGraph

    from accord.checkpointers import business

    def node(state: dict[str, Any]) -> dict[str, Any]:
        call(business)
        return {"n": 1}

    g = StateGraph(dict)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(InvalidInputError, match=words):
        g.compile(checkpointer=saver).invoke({"n": 0}, config("biz"))
    db = client[saver.db_name]
    assert db.orders.count_documents({}) == 0
    assert db.accord_workflow_events.count_documents({}) == 0


def _event(tenant: str, **changes: Any) -> dict[str, Any]:
    from accord.platform import workflow_log

    doc = workflow_log.event_doc(tenant, "w", {"a": 1}, thread_id="pw", node="n")
    return {"op": "append_event", "collection": workflow_log.COLLECTION, "document": doc | changes}


#: Staged operations ``business.*`` never stages, sent straight to ``put_writes`` (a public
#: method; a migration replays another saver's pending writes through it too).
FORGED_STAGED: dict[str, Any] = {
    "event_of_another_tenant": _event("victim"),
    "event_with_its_seq": _event("default", seq=1),
    "event_of_another_thread": _event("default", thread_id="other"),
    "event_into_accord_checkpoints": {**_event("default"), "collection": "accord_checkpoints"},
    "event_into_business_collection": {**_event("default"), "collection": "orders"},
    "insert_into_system_js": {
        "op": "insert_one", "collection": "system.js", "document": {"_id": "f", "tenant_id": "default"},
    },
    "insert_into_dollar_cmd": {
        "op": "insert_one", "collection": "x.$cmd", "document": {"_id": "f", "tenant_id": "default"},
    },
    "insert_with_nul_name": {
        "op": "insert_one", "collection": "a\x00b", "document": {"_id": "f", "tenant_id": "default"},
    },
    "insert_setting_version": {
        "op": "insert_one", "collection": "orders",
        "document": {"_id": "v", "tenant_id": "default", "_version": 99},
    },
    "update_with_string_upsert": {
        "op": "update_one", "collection": "orders", "filter": {"_id": "u", "tenant_id": "default"},
        "update": {"$set": {"x": 1}}, "upsert": "yes",
    },
    "update_of_another_tenant": {
        "op": "update_one", "collection": "orders", "filter": {"_id": "u", "tenant_id": "victim"},
        "update": {"$set": {"x": 1}},
    },
    "update_operator_not_a_document": {
        "op": "update_one", "collection": "orders", "filter": {"_id": "u", "tenant_id": "default"},
        "update": {"$inc": 5},
    },
    "unknown_operation": {"op": "drop", "collection": "orders"},
    "artifact_commit_elsewhere": {
        "op": "commit_artifact", "collection": "orders", "artifact_id": "a",
    },
    "artifact_commit_with_operator_id": {
        "op": "commit_artifact", "collection": "accord_artifacts.files", "artifact_id": {"$ne": 1},
    },
    "not_a_dict": "drop everything",
}  # fmt: skip


@pytest.mark.parametrize("name", list(FORGED_STAGED))
def test_put_writes_checks_staged_business_writes_again(
    client: MongoClient, saver: Any, name: str
) -> None:
    """A staged op that reaches put_writes without business.* is held to the same rules:
    before, an event went into another tenant's workflow log (numbered, head moved), a
    document into system.js, '_version' was set, a non-dict raised AttributeError."""
    stored = saver.put(config("pw"), generate_checkpoint(), generate_metadata(), {})
    with pytest.raises(InvalidInputError, match="refused|must be a staged business operation"):
        saver.put_writes(stored, [(BUSINESS_CHANNEL, FORGED_STAGED[name]), ("v", 1)], "task-1")
    db = client[saver.db_name]
    for coll in ("accord_workflow_events", "orders", "system.js"):
        assert db[coll].count_documents({}) == 0, coll
    assert db.accord_checkpoint_writes.count_documents({}) == 0
    tup = saver.get_tuple(stored)
    assert tup is not None and tup.pending_writes == []


def test_put_writes_takes_what_business_stages(client: MongoClient, saver: Any) -> None:
    """The checks above refuse nothing business.* stages: an event and an insert pass."""
    stored = saver.put(config("pw"), generate_checkpoint(), generate_metadata(), {})
    insert = {
        "op": "insert_one", "collection": "orders", "document": {"_id": "o", "tenant_id": "default"},
        "node": "n",
    }  # fmt: skip
    saver.put_writes(
        stored, [(BUSINESS_CHANNEL, _event("default")), (BUSINESS_CHANNEL, insert)], "t"
    )
    db = client[saver.db_name]
    assert db.orders.count_documents({"_id": "o", "tenant_id": "default", "_version": 1}) == 1
    assert db.accord_workflow_events.count_documents({"workflow": "w", "seq": 1}) == 1


def test_a_saver_built_for_one_tenant_serves_no_other(
    client: MongoClient, saver: Any, saver_factory: Any
) -> None:
    """An application forwarding a client's config (LangGraph's config.configurable) to a
    saver built with tenant_id= reached another tenant's threads through
    configurable.tenant_id, while a store built with tenant_id= refused such a run."""
    victim = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "tenant_id": "beta"}}
    stored = saver.put(victim, generate_checkpoint(), generate_metadata(), {})
    acme = saver_factory(tenant_id="acme")
    for call in (
        lambda: acme.get_tuple(victim),
        lambda: list(acme.list(victim)),
        lambda: acme.put(victim, generate_checkpoint(), generate_metadata(), {}),
        lambda: acme.put_writes(stored, [("v", 1)], "task"),
        lambda: acme.delete_thread("t", tenant_id="beta"),
        lambda: acme.copy_thread("t", "t2", tenant_id="beta"),
        lambda: acme.prune(["t"], tenant_id="beta"),
    ):
        with pytest.raises(InvalidInputError, match="serves tenant 'acme' only"):
            call()
    assert client[saver.db_name].accord_checkpoints.count_documents({}) == 1
    assert saver.get_tuple(victim) is not None  # beta's thread is untouched
    # its own tenant, named or not, and an unpinned saver serving any tenant, as before
    mine = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "tenant_id": "acme"}}
    acme.put(mine, generate_checkpoint(), generate_metadata(), {})
    assert acme.get_tuple(config("t")) is not None
    assert saver.get_tuple(mine) is not None


S = "\ud800"  # a lone surrogate: what a JSON "\ud800" decodes to, and no UTF-8


def test_lone_surrogates_are_refused_before_any_query(client: MongoClient, saver: Any) -> None:
    """Before: a raw UnicodeEncodeError from the driver (the memory store refused the
    same input cleanly)."""
    cp = generate_checkpoint()
    for call, words in (
        (lambda: saver.get_tuple(config("a" + S)), "thread_id holds"),
        (lambda: saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": S}}),
         "checkpoint_ns"),
        (lambda: saver.get_tuple(config("t", tenant_id=S)), "tenant_id"),
        (lambda: saver.get_tuple(config("t", S)), "checkpoint_id"),
        (lambda: saver.put(config(S), cp, generate_metadata(), {}), "thread_id"),
        (lambda: list(saver.list(config("t"), filter={"source": S})), "value holds"),
        (lambda: list(saver.list(config("t"), filter={"n": {"m": ["x", S]}})), "value holds"),
        (lambda: list(saver.list(config("t"), filter={S: 1})), "key"),
        (lambda: list(saver.list(config("t"), filter={"n": {S: 1}})), "key"),
        (lambda: list(saver.list(config("t"), before=config("t", S))), "checkpoint_id"),
        (lambda: saver.put_writes(config("t", "c"), [("v", 1)], S), "task_id"),
        (lambda: saver.put_writes(config("t", "c"), [(S, 1)], "task"), "channel"),
        (lambda: saver.delete_thread(S), "thread_id"),
        (lambda: saver.prune([S]), "thread_ids"),
    ):  # fmt: skip
        with pytest.raises(InvalidInputError, match=f"{words}.*lone surrogate"):
            call()
    assert _total(client, saver.db_name) == 0


def test_metadata_that_no_filter_can_match_is_stored_but_not_indexed(
    client: MongoClient, saver: Any
) -> None:
    """Metadata a filter could not match (a lone surrogate, nested past what MongoDB
    stores in the checkpoint document) stays in the serialized metadata only: before,
    the put failed (UnicodeEncodeError, or the server's nesting limit)."""
    deep: Any = 1
    for _ in range(179):
        deep = {"a": deep}
    stored = saver.put(config("m"), generate_checkpoint(),
                       generate_metadata(odd=S, deep=deep, plain="p"), {})  # fmt: skip
    doc = client[saver.db_name].accord_checkpoints.find_one({"thread_id": "m"})
    assert doc is not None and doc["meta"]["plain"] == "p"
    assert "odd" not in doc["meta"] and "deep" not in doc["meta"]
    tup = saver.get_tuple(stored)
    # (LangGraph's serializer itself stores the surrogate as "?")
    assert tup is not None and "odd" in tup.metadata and tup.metadata["deep"] == deep


@pytest.mark.parametrize("shape", ["dict", "list"])
def test_deeply_nested_metadata_filters_are_refused(saver: Any, shape: str) -> None:
    """Before: a raw RecursionError. MongoDB stores nothing nested that deep, so such a
    filter could match nothing; one within the limit still matches."""

    def nest(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = {"a": value} if shape == "dict" else [value]
        return value

    for levels in (181, 3000):
        with pytest.raises(InvalidInputError, match="nested more than 180 levels"):
            list(saver.list(None, filter={"x": nest(levels)}))
    # and an integer too large to quote (before: a raw ValueError from str())
    with pytest.raises(InvalidInputError, match="got one of 16610 bits"):
        list(saver.list(None, filter={"x": 10**5000}))
    saver.put(config("d"), generate_checkpoint(), generate_metadata(x=nest(100)), {})
    assert len(list(saver.list(None, filter={"x": nest(100)}))) == 1


@pytest.mark.parametrize(
    "run_id", ["a\x00b", "x" * 20_000, "r" + S], ids=["nul", "long", "surrogate"]
)
def test_run_ids_are_validated_before_the_run_claims_the_thread(
    client: MongoClient, saver: Any, run_id: str
) -> None:
    """The run id a caller gives LangGraph (config["run_id"]) names the run in the run
    registry: before, NUL and 20,000 characters were written there, and a lone surrogate
    was a raw UnicodeEncodeError."""
    from langgraph.graph import START, StateGraph

    g = StateGraph(dict)
    g.add_node("node", lambda state: {"n": 1})
    g.add_edge(START, "node")
    graph = g.compile(checkpointer=saver)
    with pytest.raises(InvalidInputError, match=r"config\['run_id'\]"):
        graph.invoke({"n": 0}, {**config("r"), "run_id": run_id})
    assert _total(client, saver.db_name) == 0
    graph.invoke({"n": 0}, {**config("r"), "run_id": "run-1"})  # a good one, as before
    doc = client[saver.db_name][saver.collections.runs].find_one({"thread_id": "r"})
    assert doc is not None and doc["run_id"] == "run-1"
