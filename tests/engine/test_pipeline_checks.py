"""A pipeline is checked whole before any of it runs, as mongod parses it (issue 22,
items 4 and 9).

``$vectorSearch`` is only valid as the first stage of a top-level pipeline: inside
``$facet`` it is 40600, inside a ``$lookup`` sub-pipeline 51047, with mongod's messages.
The engine used to notice only when the stage's turn came, after reading the whole
collection. Its numbers must be numbers: NaN and infinities for ``limit`` and
``numCandidates`` were internal errors (code 1, ``ValueError``).

Through pymongo, so these run against a real server too (an Atlas or Atlas Local one for
``$vectorSearch``); the tests that show nothing was read first are in-process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bson
import pytest
from pymongo.errors import OperationFailure

from accord.platform.embedded.dispatch import Dispatcher
from accord.platform.embedded.engine import Engine

embedded_only = pytest.mark.embedded_only
VECTOR = {"index": "vi", "path": "embedding", "queryVector": [0.5, 0.5], "exact": True,
          "limit": 3}  # fmt: skip


def _error(coll: Any, pipeline: list[Any]) -> OperationFailure:
    with pytest.raises(OperationFailure) as info:
        list(coll.aggregate(pipeline))
    return info.value


@pytest.mark.parametrize(
    "pipeline, code, message",
    [
        ([{"$facet": {"a": [{"$vectorSearch": VECTOR}]}}], 40600,
         "$vectorSearch is not allowed to be used within a $facet stage"),
        ([{"$match": {}}, {"$facet": {"a": [{"$match": {}}], "b": [{"$vectorSearch": VECTOR}]}}],
         40600, "$vectorSearch is not allowed to be used within a $facet stage"),
        ([{"$lookup": {"from": "c", "as": "x", "pipeline": [{"$vectorSearch": VECTOR}]}}], 51047,
         "$vectorSearch is not allowed within a $lookup's sub-pipeline"),
        ([{"$facet": {"a": [{"$lookup": {"from": "c", "as": "x",
                                         "pipeline": [{"$vectorSearch": VECTOR}]}}]}}],
         51047, "$vectorSearch is not allowed within a $lookup's sub-pipeline"),
        ([{"$facet": {"a": [{"$out": "elsewhere"}]}}], 40600,
         "$out is not allowed to be used within a $facet stage"),
        ([{"$lookup": {"from": "c", "as": "x", "pipeline": [{"$merge": "elsewhere"}]}}], 51047,
         "$merge is not allowed within a $lookup's sub-pipeline"),
        ([{"$facet": {"a": [{"$facet": {"b": [{"$match": {}}]}}]}}], 40600,
         "$facet is not allowed to be used within a $facet stage"),
        ([{"$lookup": {"from": "c", "as": "x", "pipeline": [{"$match": {}},
                                                            {"$documents": [{"a": 1}]}]}}],
         40602, "$documents is only valid as the first stage in a pipeline"),
        ([{"$match": {}}, {"$vectorSearch": VECTOR}], 40602,
         "$vectorSearch is only valid as the first stage in a pipeline"),
    ],
)  # fmt: skip
def test_a_stage_where_it_may_not_stand_is_refused(
    db: Any, pipeline: list[Any], code: int, message: str
) -> None:
    db.c.insert_many([{"_id": i, "embedding": [1.0, 0.0]} for i in range(3)])
    err = _error(db.c, pipeline)
    assert err.code == code, err
    assert message in str(err)


@pytest.mark.parametrize(
    "stage, message",
    [
        ({"numCandidates": float("nan"), "limit": 5}, '"numCandidates" must be a int'),
        ({"numCandidates": float("inf"), "limit": 5}, '"numCandidates" must be a int'),
        ({"numCandidates": float("-inf"), "limit": 5}, '"numCandidates" must be a int'),
        ({"numCandidates": 10, "limit": float("inf")}, '"limit" must be a int'),
        ({"exact": True, "limit": float("inf")}, '"limit" must be a int'),
    ],
)
def test_non_finite_numbers_of_a_vector_search_are_refused_by_mongot(
    db: Any, stage: dict[str, Any], message: str
) -> None:
    """What mongot checks: code 8 (its errors reach the client as UnknownError)."""
    spec = {"index": "vi", "path": "embedding", "queryVector": [0.5, 0.5], **stage}
    db.c.insert_one({"embedding": [1.0, 0.0]})
    err = _error(db.c, [{"$vectorSearch": spec}])
    assert err.code == 8, err
    assert message in str(err)


@pytest.mark.parametrize(
    "limit, code, message",
    [
        (float("nan"), 7912700, "Expected limit to be positive"),
        (float("-inf"), 7912700, "Expected limit to be positive"),
        (-2, 7912700, "Expected limit to be positive"),
        ("5", 8575100, "Expected limit field to be a number in $vectorSearch"),
    ],
)
def test_a_vector_search_limit_is_checked_by_mongod(
    db: Any, limit: Any, code: int, message: str
) -> None:
    """mongod checks ``limit`` itself when it parses the stage (NaN converts to 0)."""
    spec = {"index": "vi", "path": "embedding", "queryVector": [0.5, 0.5], "exact": True,
            "limit": limit}  # fmt: skip
    db.c.insert_one({"embedding": [1.0, 0.0]})
    err = _error(db.c, [{"$vectorSearch": spec}])
    assert err.code == code, err
    assert message in str(err)


# -- refused before any work (in-process: the engine's reads are counted) ----------------------


@pytest.fixture()
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    engine = Engine(tmp_path, sync=False)
    d = Dispatcher(engine, lambda cmd: {"ok": 1.0})
    reply = d.execute(
        {"insert": "c", "documents": [{"_id": i, "g": i % 3} for i in range(50)], "$db": "t"}
    )
    assert reply["ok"] == 1
    reads: list[str] = []
    find = engine.find

    def counting_find(txn: Any, ns: str, q: Any) -> Any:
        reads.append(ns)
        return find(txn, ns, q)

    monkeypatch.setattr(engine, "find", counting_find)
    yield d, reads
    with engine.locked("shutdown"):
        engine.close()


@embedded_only
@pytest.mark.parametrize(
    "pipeline, code",
    [
        ([{"$sort": {"g": 1}}, {"$facet": {"a": [{"$vectorSearch": VECTOR}]}}], 40600),
        ([{"$group": {"_id": "$g"}},
          {"$lookup": {"from": "c", "as": "x", "pipeline": [{"$vectorSearch": VECTOR}]}}], 51047),
        ([{"$sort": {"g": 1}}, {"$unionWith": {"coll": "c"}}], 40324),
        ([{"$sort": {"g": 1}}, {"$facet": {"a": [{"$noSuchStage": {}}]}}], 40324),
        ([{"$sort": {"g": 1}}, {"$out": "d"}, {"$match": {}}], 40601),
    ],
)  # fmt: skip
def test_an_invalid_pipeline_is_refused_before_anything_is_read(
    counted: Any, pipeline: list[Any], code: int
) -> None:
    d, reads = counted
    reply = bson.decode(
        bson.encode(d.execute({"aggregate": "c", "pipeline": pipeline, "cursor": {}, "$db": "t"}))
    )
    assert reply["ok"] == 0 and reply["code"] == code, reply
    assert reads == [], "the pipeline was refused only after reading the collection"
