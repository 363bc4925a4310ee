"""Bad input and abuse that must get MongoDB's errors, not internal errors, stalls or bloat.

Each case was found by fault testing: before its fix it answered an internal error
(code 1), accepted something MongoDB refuses, held the engine lock for seconds while
other clients waited, or held memory for an hour.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import bson
import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure, WriteError

# -- time limits ---------------------------------------------------------------------------


def _run_bounded(fn, limit_s: float = 20.0):
    """Run ``fn`` in a thread; fail if it is still running after ``limit_s`` (a hang)."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except Exception as exc:  # the assertion is on what it raised
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"still running after {limit_s} s"
    return outcome


def test_the_issue_regex_honours_max_time_ms(db) -> None:
    # ^(a+)+$ on 29 a's and a b: 12.6 s under the engine lock with Python's re.
    db["r"].insert_one({"s": "a" * 29 + "b"})
    started = time.monotonic()
    outcome = _run_bounded(
        lambda: list(db["r"].find({"s": {"$regex": "^(a+)+$"}}).max_time_ms(1000))
    )
    assert outcome.get("value") == [] or getattr(outcome.get("error"), "code", None) == 50
    assert time.monotonic() - started < 10


def test_a_catastrophic_regex_is_cut_off_not_run_for_minutes(db) -> None:
    # ^(a|aa)+$ backtracks exponentially even in the regex package.
    db["r"].insert_one({"s": "a" * 40 + "b"})
    outcome = _run_bounded(lambda: list(db["r"].find({"s": {"$regex": "^(a|aa)+$"}})))
    error = outcome.get("error")
    # MongoDB's regex engine stops at its match limit; this engine at its regex bound.
    assert outcome.get("value") == [] or isinstance(error, OperationFailure), outcome
    outcome = _run_bounded(
        lambda: list(db["r"].find({"s": {"$regex": "^(a|aa)+$"}}).max_time_ms(200))
    )
    assert outcome.get("value") == [] or getattr(outcome.get("error"), "code", None) in (50, 51156)
    assert db["r"].count_documents({}) == 1  # and the server serves on


def test_a_nested_add_is_evaluated_once_per_level(db) -> None:
    """Each level of a nested ``$add`` evaluated its arguments twice: 2^depth evaluations
    (depth 17 held the engine, and every client, for 23-38 s)."""
    db["n"].insert_one({"a": 1})
    expr: object = "$a"
    for _ in range(40):
        expr = {"$add": [expr, 1]}
    outcome = _run_bounded(
        lambda: list(db["n"].find({"$expr": {"$eq": [expr, 41]}}, {"_id": 0})), limit_s=10
    )
    assert outcome.get("value") == [{"a": 1}], outcome
    big = db["n"].aggregate([{"$project": {"_id": 0, "s": {"$add": [2**62, 2**62]}}}])
    assert list(big) == [{"s": float(2**63)}]  # a long's overflow is a double, as in mongod


def test_regexes_in_in_and_expressions_are_bounded_too(db) -> None:
    import re

    db["r"].insert_one({"s": "a" * 40 + "b"})
    slow = re.compile("^(a|aa)+$")
    for run in (
        lambda: list(db["r"].find({"s": {"$in": [slow]}}).max_time_ms(200)),
        lambda: list(
            db["r"].aggregate(
                [{"$match": {"$expr": {"$regexMatch": {"input": "$s", "regex": "^(a|aa)+$"}}}}],
                maxTimeMS=200,
            )
        ),
    ):
        outcome = _run_bounded(run)
        assert outcome.get("value") == [] or getattr(outcome.get("error"), "code", None) in (
            50,
            51156,
        ), outcome


def test_max_time_ms_stops_a_long_aggregation(db) -> None:
    db["big"].insert_many([{"i": i, "g": i % 97, "s": f"x{i}"} for i in range(20_000)])
    with pytest.raises(OperationFailure) as info:
        list(
            db["big"].aggregate(
                [{"$match": {"s": {"$regex": "x"}}}, {"$group": {"_id": "$g", "n": {"$sum": 1}}}],
                maxTimeMS=1,
            )
        )
    assert info.value.code == 50
    assert db["big"].count_documents({"g": 0}) > 0  # nothing is left locked


@pytest.mark.parametrize("bad", [-1, 1.5, "10", float("nan")])
def test_bad_max_time_ms_is_refused(db, bad) -> None:
    with pytest.raises(OperationFailure) as info:
        db.command({"find": "r", "maxTimeMS": bad})
    assert info.value.code in (2, 14)


# -- numbers that are not counts -------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [("limit", float("inf")), ("batchSize", float("nan")), ("skip", float("inf")), ("limit", 2.5)],
)
def test_find_counts_must_be_integers(db, field: str, value: float) -> None:
    db["r"].insert_one({})
    with pytest.raises(OperationFailure) as info:
        db.command({"find": "r", field: value})
    assert info.value.code not in (1, None)


# -- partial indexes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "partial",
    [
        {"$where": "this.a > 1"},
        {"$expr": {"$gt": ["$a", 1]}},
        {"a": {"$regex": "^x"}},
        {"a": {"$not": {"$gt": 1}}},
        {"a": {"$exists": False}},
        {"a": {"$type": "nosuchtype"}},
        {"$nor": [{"a": 1}]},
    ],
)
def test_partial_filters_mongodb_refuses_are_refused(db, partial: dict) -> None:
    with pytest.raises(OperationFailure) as info:
        db["p"].create_index("a", unique=True, partialFilterExpression=partial)
    assert info.value.code not in (1, None)
    db["p"].insert_one({"a": 2})  # and writes still work
    assert [i["name"] for i in db["p"].list_indexes()] == ["_id_"]


def test_a_supported_partial_filter_still_works(db) -> None:
    db["p"].create_index(
        "a",
        unique=True,
        partialFilterExpression={"$and": [{"a": {"$gt": 0}}, {"b": {"$in": [1, 2]}}]},
    )
    db["p"].insert_many([{"a": 1, "b": 1}, {"a": 1, "b": 3}])
    with pytest.raises(WriteError):
        db["p"].insert_one({"a": 1, "b": 2})


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["a$b", "", "\x00x", ".x"])
def test_rename_refuses_names_create_refuses(client: MongoClient, db, target: str) -> None:
    db["src"].insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as info:
        client.admin.command({"renameCollection": f"{db.name}.src", "to": f"{db.name}.{target}"})
    assert info.value.code == 73
    assert db["src"].find_one() == {"_id": 1}


def test_system_collections_and_overlong_namespaces_are_refused(client: MongoClient, db) -> None:
    """As mongod: no client writes to ``system.`` collections (but ``system.js``), and no
    namespace past 255 bytes (300,000 characters were taken)."""
    from pymongo import InsertOne

    long_name = "c" * (256 - len(db.name))
    refusals = [
        lambda: db["system.foo"].insert_one({"_id": 1}),
        lambda: db["system.users"].insert_one({"_id": 1}),
        lambda: db["system.views"].update_one({"_id": 1}, {"$set": {"a": 1}}, upsert=True),
        lambda: db["system.views"].delete_many({}),
        lambda: db["system.foo"].find_one_and_update({}, {"$set": {"a": 1}}, upsert=True),
        lambda: db.create_collection("system.foo"),
        lambda: client.bulk_write([InsertOne({"_id": 1}, namespace=f"{db.name}.system.foo")]),
        lambda: db[long_name].insert_one({"_id": 1}),
        lambda: db.create_collection(long_name),
    ]
    for call in refusals:
        with pytest.raises(OperationFailure) as info:
            call()
        error = getattr(info.value, "error", None)  # a client bulkWrite wraps it
        assert (error.code if error is not None else info.value.code) == 73, info.value
    db["src"].insert_one({"_id": 1})
    for target in ("system.foo", long_name):
        with pytest.raises(OperationFailure) as info:
            client.admin.command(
                {"renameCollection": f"{db.name}.src", "to": f"{db.name}.{target}"}
            )
        assert info.value.code == 73
    db["system.js"].insert_one({"_id": "f", "value": 1})  # the one a client may write
    assert db.name + ".system.foo" not in [f"{db.name}.{n}" for n in db.list_collection_names()]


# -- connections -----------------------------------------------------------------------------


def _hello_bytes() -> bytes:
    body = bson.encode({"hello": 1, "$db": "admin"})
    payload = struct.pack("<I", 0) + b"\x00" + body
    return struct.pack("<iiii", 16 + len(payload), 1, 0, 2013) + payload


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


@pytest.mark.embedded_only
def test_connections_over_max_conns_are_closed(tmp_path: Path) -> None:
    from accord.platform.embedded import EmbeddedServer

    with EmbeddedServer(tmp_path, port=0, sync=False, max_connections=3) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        try:
            for sock in held:  # each is served
                sock.sendall(_hello_bytes())
                assert len(sock.recv(4096)) > 16
            extra = socket.create_connection(("127.0.0.1", server.port))
            assert _closed_by_server(extra, 5.0)
            extra.close()
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 5
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        client = MongoClient(server.uri, serverSelectionTimeoutMS=5000, maxPoolSize=1)
        try:
            assert client.admin.command("ping")["ok"] == 1.0  # room again once they closed
        finally:
            client.close()


@pytest.mark.embedded_only
def test_an_incomplete_message_is_dropped_after_the_message_timeout(tmp_path: Path) -> None:
    from accord.platform.embedded import EmbeddedServer

    with EmbeddedServer(tmp_path, port=0, sync=False, message_timeout=1.0) as server:
        sock = socket.create_connection(("127.0.0.1", server.port))
        try:
            declared = 45_000_000
            sock.sendall(struct.pack("<iiii", declared, 7, 0, 2013) + b"\x00" * 4096)
            assert _closed_by_server(sock, 10.0)  # not kept (with its buffer) for an hour
        finally:
            sock.close()
        # A slow trickle does not extend the deadline either.
        sock = socket.create_connection(("127.0.0.1", server.port))
        try:
            sock.sendall(struct.pack("<iiii", 1_000_000, 8, 0, 2013))
            started = time.monotonic()
            closed = False
            while time.monotonic() - started < 10 and not closed:
                try:
                    sock.sendall(b"\x00" * 100)
                except OSError:
                    closed = True
                    break
                closed = _closed_by_server(sock, 0.3)
            assert closed
        finally:
            sock.close()


def test_write_concerns_a_single_node_cannot_honour_are_refused(client: MongoClient, db) -> None:
    """``w: 5`` and an unknown tag were acknowledged as if the write had replicated."""
    from pymongo.write_concern import WriteConcern

    for w, code in ((5, 100), ("nosuchtag", 79)):
        with pytest.raises(OperationFailure) as info:
            db.get_collection("wc", write_concern=WriteConcern(w=w)).insert_one({"w": str(w)})
        assert info.value.code == code
    assert db["wc"].count_documents({}) == 0
    for w in (1, "majority"):
        db.get_collection("wc", write_concern=WriteConcern(w=w)).insert_one({"w": str(w)})
    with client.start_session() as s:  # not on a statement inside a transaction
        s.start_transaction()
        with pytest.raises(OperationFailure) as info:
            db.command({"insert": "wc", "documents": [{"x": 1}], "writeConcern": {"w": 1}},
                       session=s)  # fmt: skip
        assert info.value.code == 72
        s.abort_transaction()
    assert db["wc"].count_documents({}) == 2


def test_start_transaction_without_autocommit_is_refused(client: MongoClient, db) -> None:
    """It ran as a plain, autocommitted command."""
    with client.start_session() as s:
        cmd = {"insert": "st", "documents": [{"_id": 1}], "txnNumber": 1, "startTransaction": True}
        with pytest.raises(OperationFailure) as info:
            db.command(cmd, session=s)
        assert info.value.code == 72
    assert db["st"].count_documents({}) == 0
