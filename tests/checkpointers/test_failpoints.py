"""Commits that fail in flight, made by the server's fail points (``configureFailPoint``).

The embedded engine (and a mongod started with ``enableTestCommands``) injects the faults a
driver meets in production, on the saver's own connections (matched by ``appName``):

- ``closeConnection`` on ``commitTransaction``: the connection drops, no reply; the
  driver retries the commit (``UnknownTransactionCommitResult``);
- ``writeConcernError`` on ``commitTransaction``: the server applies the commit, then
  reports that the write concern could not be confirmed; the driver's label is again
  ``UnknownTransactionCommitResult`` and the retried commit must not apply it twice;
- ``TransientTransactionError`` on the step's write (``bulkWrite``): the whole
  transaction is retried.

Each way, every step (checkpoint, messages, business writes) exists exactly once: not
lost, not doubled. (``test_faults.py`` proves the same for a reply lost on the wire, with a
TCP proxy.) The server's fail point reports how many times it fired, so a test whose
fault never happened cannot pass.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from pymongo import MongoClient

from accord.checkpointers import business
from accord.platform.codes import WRITE_CONFLICT
from tests.checkpointers.conftest import config, make_saver
from tests.failpoints import fail_command

APP = "accord-failpoint-test"
#: mongod's HostUnreachable: a commit whose outcome the server could not confirm.
HOST_UNREACHABLE = 6

FAULTS: dict[str, dict[str, Any]] = {
    "commit-connection-closed": {"commands": ["commitTransaction"], "close_connection": True},
    "commit-applied-write-concern-error": {
        "commands": ["commitTransaction"],
        "write_concern_error": {
            "code": 64,
            "codeName": "WriteConcernFailed",
            "errmsg": "waiting for replication timed out",
            "errInfo": {"wtimeout": True},
        },
    },
    "commit-unknown-result": {
        "commands": ["commitTransaction"],
        "error_code": HOST_UNREACHABLE,
        "error_labels": ["UnknownTransactionCommitResult"],
    },
    "step-transient-error": {
        "commands": ["bulkWrite", "insert", "update"],
        "error_code": WRITE_CONFLICT,
        "error_labels": ["TransientTransactionError"],
    },
}


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    def node(state: Log) -> dict[str, Any]:
        business.update_one("counts", {"_id": "c"}, {"$inc": {"n": 1}}, upsert=True)
        business.insert_one("once", {"_id": f"step-{len(state['log'])}"})
        return {"log": ["x"]}

    builder = StateGraph(Log)
    builder.add_node("n", node)
    builder.add_edge(START, "n")
    return builder.compile(checkpointer=saver)


def _fired(client: MongoClient) -> int:
    """How many times the failCommand fail point fired so far (the server counts)."""
    reply = client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
    return int(reply.get("count", 0))


@pytest.mark.parametrize("durability", ["sync", "async"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_commit_that_fails_in_flight_is_applied_once(
    client: MongoClient, mongo_uri: str, db_name: str, kind: str, durability: str, fault: str
) -> None:
    spec = FAULTS[fault]
    uri = f"{mongo_uri}{'&' if '?' in mongo_uri else '/?'}appName={APP}"
    with make_saver(kind, uri, db_name) as saver:
        graph = _graph(saver)
        with fail_command(
            client,
            spec["commands"],
            times=2,
            app_name=APP,
            **{k: v for k, v in spec.items() if k != "commands"},
        ):
            for i in range(3):
                out = graph.invoke({"log": [f"in{i}"]}, config("t"), durability=durability)
            fired = _fired(client)
        assert fired == 2, f"the fail point fired {fired} times, expected 2"
        assert out["log"] == ["in0", "x", "in1", "x", "in2", "x"]
        db = client[db_name]
        assert db.counts.find_one({"_id": "c"})["n"] == 3
        assert sorted(d["_id"] for d in db.once.find()) == ["step-1", "step-3", "step-5"]
        history = list(graph.get_state_history(config("t")))
        ids = {s.config["configurable"]["checkpoint_id"] for s in history}
        assert len(history) == len(ids) == 9
