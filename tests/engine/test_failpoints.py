"""Fail points (configureFailPoint) and the faults drivers must survive, through pymongo.

The session's engine runs with --enable-test-commands (tests/conftest.py); against a real
MongoDB these tests need enableTestCommands=1 and skip otherwise (tests/failpoints.py).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.errors import (
    ConnectionFailure,
    OperationFailure,
    WriteConcernError,
)

from tests.engine.helpers import recording_client
from tests.failpoints import fail_command, fail_point, require_test_commands


@pytest.fixture()
def coll(db):
    return db["fp"]


def test_error_code_fails_the_next_commands_then_stops(client: MongoClient, coll) -> None:
    coll.insert_one({"_id": 1})
    with fail_command(client, ["find"], times=2, error_code=2):
        for _ in range(2):
            with pytest.raises(OperationFailure) as info:
                coll.find_one({"_id": 1})
            assert info.value.code == 2
            assert "failCommand" in str(info.value)
        assert coll.find_one({"_id": 1}) == {"_id": 1}


def test_skip_lets_the_first_commands_through(client: MongoClient, coll) -> None:
    coll.insert_one({"_id": 1})
    with fail_point(
        client, "failCommand", {"skip": 2}, {"failCommands": ["aggregate"], "errorCode": 8}
    ):
        assert coll.count_documents({}) == 1
        assert coll.count_documents({}) == 1
        for _ in range(2):  # and then every one, until it is turned off
            with pytest.raises(OperationFailure) as info:
                coll.count_documents({})
            assert info.value.code == 8
    assert coll.count_documents({}) == 1


def test_configure_reports_how_often_it_fired(client: MongoClient, coll) -> None:
    require_test_commands(client)
    data = {"failCommands": ["distinct"], "errorCode": 2}
    client.admin.command({"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": data})
    try:
        for _ in range(3):
            with pytest.raises(OperationFailure):
                coll.distinct("x")
    finally:
        reply = client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
    assert reply["count"] == 3
    assert coll.distinct("x") == []


def test_explicit_error_labels_replace_the_servers(client: MongoClient, coll) -> None:
    with (
        fail_command(client, ["find"], error_code=11000, error_labels=["Custom"]),
        pytest.raises(OperationFailure) as info,
    ):
        coll.find_one({})
    assert info.value.has_error_label("Custom")
    assert not info.value.has_error_label("TransientTransactionError")


def test_a_retryable_write_failing_twice_carries_retryable_write_error(
    client: MongoClient, coll
) -> None:
    # times=2: the first attempt and pymongo's one retry both fail (262 ExceededTimeLimit).
    with (
        fail_command(client, ["insert"], times=2, error_code=262),
        pytest.raises(OperationFailure) as info,
    ):
        coll.insert_one({"_id": 1})
    assert info.value.code == 262
    assert info.value.has_error_label("RetryableWriteError")
    assert coll.count_documents({}) == 0


def test_a_retryable_error_is_retried_by_the_driver(client: MongoClient, coll) -> None:
    with fail_command(client, ["insert"], error_code=262):
        coll.insert_one({"_id": 1})
    assert coll.count_documents({}) == 1


def test_an_error_in_a_transaction_is_transient(client: MongoClient, coll) -> None:
    coll.insert_one({"_id": 0})
    with fail_command(client, ["insert"], error_code=262), client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure) as info:
            coll.insert_one({"_id": 1}, session=session)
        assert info.value.has_error_label("TransientTransactionError")
        session.abort_transaction()


def test_close_connection_drops_it_and_a_retryable_read_retries(mongo_uri: str, db) -> None:
    client, recorder = recording_client(mongo_uri)
    try:
        coll = client[db.name]["fp"]
        coll.insert_one({"_id": 1})
        recorder.clear()
        with fail_command(client, ["find"], close_connection=True):
            assert coll.find_one({"_id": 1}) == {"_id": 1}
        assert recorder.count("find") == 2  # the dropped attempt and the retry
        assert len(recorder.failed_events) == 1
    finally:
        client.close()


def test_close_connection_without_retry_is_a_network_error(mongo_uri: str, db) -> None:
    client = MongoClient(mongo_uri, retryReads=False)
    try:
        coll = client[db.name]["fp"]
        with (
            fail_command(client, ["find"], close_connection=True),
            pytest.raises(ConnectionFailure),
        ):
            coll.find_one({})
        assert coll.find_one({}) is None  # the next connection works
    finally:
        client.close()


def test_app_name_limits_the_fail_point_to_one_client(
    mongo_uri: str, client: MongoClient, db
) -> None:
    app = "fp-" + uuid.uuid4().hex[:8]
    named = MongoClient(mongo_uri, appName=app, retryReads=False)
    try:
        with fail_command(client, ["find"], times=None, error_code=2, app_name=app):
            assert db["fp"].find_one({}) is None  # another client is not affected
            with pytest.raises(OperationFailure):
                named[db.name]["fp"].find_one({})
    finally:
        named.close()


def test_block_connection_delays_one_client_and_holds_no_one_else(
    mongo_uri: str, client: MongoClient, db
) -> None:
    app = "fp-" + uuid.uuid4().hex[:8]
    blocked = MongoClient(mongo_uri, appName=app)
    order: list[str] = []
    try:
        with fail_command(client, ["ping"], block_ms=1500, app_name=app):

            def slow() -> None:
                started = time.monotonic()
                blocked.admin.command("ping")
                order.append(f"blocked after {time.monotonic() - started:.1f}s")

            thread = threading.Thread(target=slow)
            thread.start()
            time.sleep(0.3)
            client.admin.command("ping")  # served while the other connection waits
            db["fp"].insert_one({"_id": 1})
            order.append("other")
            thread.join(30)
        assert order[0] == "other"
        assert float(order[1].split()[2][:-1]) >= 1.4
    finally:
        blocked.close()


def test_write_concern_error_runs_the_command_and_reports_it(client: MongoClient, coll) -> None:
    wce = {
        "code": 100,
        "codeName": "UnsatisfiableWriteConcern",
        "errmsg": "Not enough data-bearing nodes",
    }
    with (
        fail_command(client, ["insert"], write_concern_error=wce),
        pytest.raises(WriteConcernError) as info,
    ):
        coll.insert_one({"_id": 1})
    assert info.value.code == 100
    assert coll.count_documents({}) == 1  # the write itself was applied


def test_a_retryable_write_concern_error_is_retried_once(mongo_uri: str, db) -> None:
    # Code 91 makes pymongo mark the server Unknown until its monitor's next check.
    client, recorder = recording_client(mongo_uri, heartbeatFrequencyMS=500)
    try:
        coll = client[db.name]["fp"]
        with fail_command(client, ["insert"], write_concern_error={"code": 91, "errmsg": "down"}):
            coll.insert_one({"_id": 1})
        assert recorder.count("insert") == 2
        assert "writeConcernError" not in recorder.replies("insert")[-1]  # the stored reply
        assert coll.count_documents({}) == 1
    finally:
        client.close()


def test_on_primary_transactional_write_loses_the_reply_not_the_write(mongo_uri: str, db) -> None:
    client, recorder = recording_client(mongo_uri)
    try:
        coll = client[db.name]["fp"]
        with fail_point(client, "onPrimaryTransactionalWrite", {"times": 1}):
            coll.insert_one({"_id": 1, "n": 1})
            coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
        # The insert committed and its reply was lost; the retry got the stored reply
        # instead of a duplicate-key error, and the update applied once.
        assert recorder.count("insert") == 2
        assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 2}
    finally:
        client.close()


def test_fail_before_commit_aborts_the_write(client: MongoClient, coll) -> None:
    data = {"closeConnection": False, "failBeforeCommitExceptionCode": 8}
    with (
        fail_point(client, "onPrimaryTransactionalWrite", {"times": 1}, data),
        pytest.raises(OperationFailure) as info,
    ):
        coll.insert_one({"_id": 1})
    assert info.value.code == 8
    assert coll.count_documents({}) == 0


def _transfer(client: MongoClient, db_name: str) -> None:
    def callback(session) -> None:
        coll = client[db_name]["fp"]
        coll.insert_one({"_id": "transfer"}, session=session)
        coll.update_one({"_id": "balance"}, {"$inc": {"n": 1}}, session=session)

    with client.start_session() as session:
        session.with_transaction(callback)


@pytest.mark.parametrize(
    "fault",
    [
        {"close_connection": True},
        {"write_concern_error": {"code": 64, "errmsg": "waiting for replication timed out"}},
        {"error_code": 262},
    ],
    ids=["reply-lost", "write-concern-error", "retryable-error"],
)
def test_a_commit_whose_outcome_is_unknown_is_applied_exactly_once(
    client: MongoClient, db, fault: dict
) -> None:
    db["fp"].insert_one({"_id": "balance", "n": 0})
    with fail_command(client, ["commitTransaction"], **fault):
        _transfer(client, db.name)
    assert db["fp"].count_documents({"_id": "transfer"}) == 1
    assert db["fp"].find_one({"_id": "balance"}) == {"_id": "balance", "n": 1}


def test_a_transient_error_retries_the_whole_transaction_once(client: MongoClient, db) -> None:
    db["fp"].insert_one({"_id": "balance", "n": 0})
    with fail_command(
        client, ["update"], error_code=112, error_labels=["TransientTransactionError"]
    ):
        _transfer(client, db.name)
    assert db["fp"].count_documents({"_id": "transfer"}) == 1
    assert db["fp"].find_one({"_id": "balance"}) == {"_id": "balance", "n": 1}


def test_unknown_fail_point_and_bad_modes_are_refused(client: MongoClient) -> None:
    require_test_commands(client)
    with pytest.raises(OperationFailure):
        client.admin.command({"configureFailPoint": "noSuchFailPoint", "mode": "off"})
    for mode in ({"times": -1}, {"sometimes": 1}, "often"):
        with pytest.raises(OperationFailure):
            client.admin.command(
                {"configureFailPoint": "failCommand", "mode": mode, "data": {"failCommands": []}}
            )


def test_kill_all_sessions_aborts_open_transactions(client: MongoClient, db) -> None:
    db["fp"].insert_one({"_id": 0})
    session = client.start_session()
    try:
        session.start_transaction()
        db["fp"].insert_one({"_id": 1}, session=session)
        other = MongoClient(client.address[0], client.address[1], directConnection=True)
        try:
            other.admin.command("killAllSessions", [])
        finally:
            other.close()
        with pytest.raises(OperationFailure) as info:
            session.commit_transaction()
        assert info.value.code == 251  # NoSuchTransaction
    finally:
        session.end_session()
    assert db["fp"].count_documents({}) == 1


def test_list_local_sessions_lists_a_used_session(client: MongoClient) -> None:
    with client.start_session() as session:
        client.admin.command("ping", session=session)
        sessions = list(client.admin.aggregate([{"$listLocalSessions": {}}]))
        ids = [s["_id"]["id"] for s in sessions]
        assert session.session_id["id"] in ids
        assert all("lastUse" in s for s in sessions)


def test_end_sessions_needs_an_array(client: MongoClient) -> None:
    with pytest.raises(OperationFailure) as info:
        client.admin.command({"endSessions": 1})
    assert info.value.code == 14


@pytest.mark.embedded_only
def test_test_commands_are_off_unless_enabled(tmp_path: Path) -> None:
    from accord.platform.embedded import EmbeddedServer

    with EmbeddedServer(tmp_path, port=0, sync=False) as server:
        plain = MongoClient(server.uri)
        try:
            assert plain.admin.command("getParameter", "*")["enableTestCommands"] is False
            with pytest.raises(OperationFailure) as info:
                plain.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
            assert info.value.code == 59
        finally:
            plain.close()
