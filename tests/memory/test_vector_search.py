"""``$vectorSearch`` and search index commands through pymongo, checked against numpy.

Every expectation is computed independently here (numpy over the inserted vectors, Python
over the filter), so a result that merely looks plausible does not pass.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from bson.binary import Binary, BinaryVectorDtype
from pymongo import MongoClient
from pymongo.errors import OperationFailure
from pymongo.operations import SearchIndexModel

from accord.platform.embedded import vector_search

DIMS = 16
N = 300
COLORS = ["red", "green", "blue"]


def wait_queryable(coll, name: str, timeout: float = 60.0) -> None:
    """Atlas builds search indexes asynchronously; the engine's are ready at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(coll.list_search_indexes(name))
        if found and found[0].get("queryable"):
            return
        time.sleep(0.5)
    raise AssertionError(f"search index {name} never became queryable")


def make_index(coll, similarity: str = "cosine", name: str = "vi", dims: int = DIMS) -> None:
    coll.create_search_index(
        SearchIndexModel(
            definition={
                "fields": [
                    {"type": "vector", "path": "embedding", "numDimensions": dims,
                     "similarity": similarity},
                    {"type": "filter", "path": "tenant_id"},
                    {"type": "filter", "path": "color"},
                    {"type": "filter", "path": "n"},
                    {"type": "filter", "path": "tags"},
                ]
            },
            name=name,
            type="vectorSearch",
        )
    )  # fmt: skip
    wait_queryable(coll, name)


@pytest.fixture()
def corpus(db):
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(N, DIMS)).astype(np.float32)
    docs = [
        {
            "_id": i,
            "tenant_id": f"t{i % 2}",
            "color": COLORS[i % 3],
            "n": i,
            "tags": [COLORS[i % 3], f"g{i % 5}"],
            "embedding": vectors[i].tolist(),
        }
        for i in range(N)
    ]
    db.items.insert_many(docs)
    return db.items, docs, vectors, rng


def expected(vectors, docs, q, similarity, keep, limit):
    if similarity == "cosine":
        v = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        s = (1 + v @ (q / np.linalg.norm(q))) / 2
    elif similarity == "dotProduct":
        s = (1 + vectors @ q) / 2
    else:
        s = 1 / (1 + ((vectors - q) ** 2).sum(axis=1))
    order = [i for i in np.argsort(-s, kind="stable") if keep(docs[i])]
    return [int(i) for i in order[:limit]], s


def search(coll, q, limit=10, **kw):
    stage = {"index": "vi", "path": "embedding", "queryVector": list(map(float, q)),
             "limit": limit, **kw}  # fmt: skip
    if "numCandidates" not in kw:
        stage["exact"] = True
    pipeline = [{"$vectorSearch": stage},
                {"$project": {"n": 1, "score": {"$meta": "vectorSearchScore"}}}]  # fmt: skip
    return list(coll.aggregate(pipeline))


@pytest.mark.parametrize("similarity", ["cosine", "euclidean", "dotProduct"])
def test_exact_search_equals_numpy(corpus, similarity):
    coll, docs, vectors, rng = corpus
    make_index(coll, similarity)
    for _ in range(5):
        q = rng.normal(size=DIMS).astype(np.float32)
        ids, scores = expected(vectors, docs, q, similarity, lambda d: True, 10)
        got = search(coll, q)
        assert [d["_id"] for d in got] == ids
        for d in got:
            assert d["score"] == pytest.approx(float(scores[d["_id"]]), rel=1e-5, abs=1e-6)


FILTERS = [
    ({"tenant_id": "t1"}, lambda d: d["tenant_id"] == "t1"),
    ({"tenant_id": {"$eq": "t0"}, "color": {"$ne": "red"}},
     lambda d: d["tenant_id"] == "t0" and d["color"] != "red"),
    ({"color": {"$in": ["red", "blue"]}}, lambda d: d["color"] in ("red", "blue")),
    ({"color": {"$nin": ["red", "blue"]}}, lambda d: d["color"] not in ("red", "blue")),
    ({"n": {"$gt": 100, "$lte": 200}}, lambda d: 100 < d["n"] <= 200),
    ({"n": {"$gte": 250}}, lambda d: d["n"] >= 250),
    ({"n": {"$lt": 20}}, lambda d: d["n"] < 20),
    ({"$or": [{"color": "red"}, {"n": {"$lt": 10}}]}, lambda d: d["color"] == "red" or d["n"] < 10),
    ({"$and": [{"tenant_id": "t0"}, {"n": {"$not": {"$gt": 50}}}]},
     lambda d: d["tenant_id"] == "t0" and not d["n"] > 50),
    ({"tags": "g3"}, lambda d: "g3" in d["tags"]),
    ({"tags": {"$in": ["g1", "g2"]}, "tenant_id": "t1"},
     lambda d: bool({"g1", "g2"} & set(d["tags"])) and d["tenant_id"] == "t1"),
    ({"color": {"$exists": True}}, lambda d: True),
]  # fmt: skip


@pytest.mark.parametrize("filt,keep", FILTERS)
def test_pre_filters_equal_python_evaluation(corpus, filt, keep):
    coll, docs, vectors, rng = corpus
    make_index(coll)
    q = rng.normal(size=DIMS).astype(np.float32)
    ids, _ = expected(vectors, docs, q, "cosine", keep, 20)
    assert [d["_id"] for d in search(coll, q, limit=20, filter=filt)] == ids


def test_approximate_query_returns_the_exact_neighbours(corpus):
    coll, docs, vectors, rng = corpus
    make_index(coll)
    q = rng.normal(size=DIMS).astype(np.float32)
    ids, _ = expected(vectors, docs, q, "cosine", lambda d: d["tenant_id"] == "t0", 7)
    got = search(coll, q, limit=7, numCandidates=70, filter={"tenant_id": "t0"})
    assert [d["_id"] for d in got] == ids


def test_binary_vectors_are_indexed_like_arrays(db):
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(50, DIMS)).astype(np.float32)
    db.items.insert_many(
        [{"_id": i, "n": i, "embedding": Binary.from_vector(vectors[i].tolist(),
                                                          BinaryVectorDtype.FLOAT32)}
         for i in range(50)]
    )  # fmt: skip
    make_index(db.items)
    q = rng.normal(size=DIMS).astype(np.float32)
    ids, _ = expected(vectors, [{}] * 50, q, "cosine", lambda d: True, 5)
    assert [d["_id"] for d in search(db.items, q, limit=5)] == ids


@pytest.mark.parametrize("similarity", ["cosine", "euclidean", "dotProduct"])
def test_bulk_built_binary_index_equals_numpy(db, similarity):
    """An index built over existing BinData vectors (decoded in bulk) answers as numpy does,
    skips the unusable ones, and stays right as documents change afterwards."""
    rng = np.random.default_rng(11)
    vectors = rng.normal(size=(300, DIMS)).astype(np.float32)
    docs = [{"_id": i, "n": i, "tenant_id": f"t{i % 3}",
             "embedding": Binary.from_vector(vectors[i].tolist(), BinaryVectorDtype.FLOAT32)
             if i % 4 else vectors[i].tolist()}
            for i in range(300)]  # fmt: skip
    bad = [
        {"_id": "nan", "embedding": Binary.from_vector([float("nan")] * DIMS,
                                                       BinaryVectorDtype.FLOAT32)},
        {"_id": "short", "embedding": Binary.from_vector([1.0] * 3, BinaryVectorDtype.FLOAT32)},
        {"_id": "int8", "embedding": Binary.from_vector([1] * DIMS, BinaryVectorDtype.INT8)},
    ]  # fmt: skip
    if similarity == "cosine":
        bad.append({"_id": "zero", "embedding": Binary.from_vector([0.0] * DIMS,
                                                                   BinaryVectorDtype.FLOAT32)})  # fmt: skip
    db.items.insert_many(docs + bad)
    make_index(db.items, similarity)
    keep = lambda d: d.get("tenant_id") == "t1"  # noqa: E731
    for _ in range(3):
        q = rng.normal(size=DIMS).astype(np.float32)
        ids, scores = expected(vectors, docs, q, similarity, keep, 7)
        got = search(db.items, q, limit=7, filter={"tenant_id": "t1"})
        assert [d["_id"] for d in got] == ids
        for d in got:
            assert d["score"] == pytest.approx(float(scores[d["_id"]]), rel=1e-5, abs=1e-6)
    hits = search(db.items, vectors[0], limit=400)
    # Unusable vectors (NaN, wrong length, zero under cosine) are not indexed; an INT8
    # vector of the right length is.
    assert {d["_id"] for d in hits} == set(range(300)) | {"int8"}
    db.items.delete_many({"_id": {"$in": [1, 2, 3]}})
    db.items.update_one({"_id": 5}, {"$set": {"tenant_id": "t1"}})
    docs[5]["tenant_id"] = "t1"
    q = rng.normal(size=DIMS).astype(np.float32)
    got = [d["_id"] for d in search(db.items, q, limit=10, filter={"tenant_id": "t1"})]
    order = [i for i in expected(vectors, docs, q, similarity, lambda d: True, 300)[0]
             if i not in (1, 2, 3) and docs[i]["tenant_id"] == "t1"]  # fmt: skip
    assert got == order[:10]


def test_documents_without_a_usable_vector_are_skipped(db):
    good = [1.0] + [0.0] * (DIMS - 1)
    db.items.insert_many([
        {"_id": "ok", "embedding": good},
        {"_id": "short", "embedding": [1.0, 0.0]},
        {"_id": "zero", "embedding": [0.0] * DIMS},
        {"_id": "text", "embedding": "not a vector"},
        {"_id": "missing"},
    ])  # fmt: skip
    make_index(db.items)
    assert [d["_id"] for d in search(db.items, good)] == ["ok"]


def test_writes_after_index_creation_are_searchable(corpus):
    coll, docs, vectors, rng = corpus
    make_index(coll)
    q = rng.normal(size=DIMS).astype(np.float32)
    coll.insert_one({"_id": "new", "n": -1, "tenant_id": "t0", "embedding": q.tolist()})
    assert search(coll, q, limit=1)[0]["_id"] == "new"
    coll.update_one({"_id": "new"}, {"$set": {"embedding": (-q).tolist()}})
    assert search(coll, q, limit=1)[0]["_id"] != "new"
    coll.update_one({"_id": "new"}, {"$set": {"embedding": q.tolist()}})
    coll.delete_one({"_id": "new"})
    assert all(d["_id"] != "new" for d in search(coll, q, limit=N))
    assert len(search(coll, q, limit=N + 10)) == N


# -- errors as Atlas reports them ------------------------------------------------------------


def error_of(coll, pipeline) -> OperationFailure:
    with pytest.raises(OperationFailure) as info:
        list(coll.aggregate(pipeline))
    return info.value


def vs(**kw):
    return {"$vectorSearch": {"index": "vi", "path": "embedding",
                              "queryVector": [0.5] * DIMS, **kw}}  # fmt: skip


def test_not_first_stage_is_refused(corpus):
    coll = corpus[0]
    make_index(coll)
    err = error_of(coll, [{"$match": {}}, vs(exact=True, limit=3)])
    assert err.code == 40602
    assert "$vectorSearch is only valid as the first stage in a pipeline" in str(err)


def test_filter_on_a_field_not_indexed_as_filter(corpus):
    coll = corpus[0]
    make_index(coll)
    err = error_of(coll, [vs(exact=True, limit=3, filter={"embedding_text": "x"})])
    assert "Path 'embedding_text' needs to be indexed as filter" in str(err)
    err = error_of(
        coll, [vs(exact=True, limit=3, filter={"$or": [{"tenant_id": "t0"}, {"secret": 1}]})]
    )
    assert "Path 'secret' needs to be indexed as filter" in str(err)


@pytest.mark.parametrize("kw,message", [
    ({"numCandidates": 10001, "limit": 5}, '"numCandidates" must be within bounds [1..10000]'),
    ({"numCandidates": 0, "limit": 5}, '"numCandidates" must be within bounds [1..10000]'),
    ({"numCandidates": 4, "limit": 5}, "limit should be less than or equal to numCandidates"),
    ({"limit": 5}, "numCandidates is required for approximate vector search"),
    ({"exact": True, "numCandidates": 10, "limit": 5},
     '"numCandidates" must be omitted when "exact" is set to true'),
    ({"exact": True, "limit": 0}, "Expected limit to be positive"),  # mongod's own check
    ({"exact": True, "limit": 3, "filter": {"color": {"$regex": "r"}}},
     'unrecognized field "$regex"'),
])  # fmt: skip
def test_parameter_errors(corpus, kw, message):
    coll = corpus[0]
    make_index(coll)
    assert message in str(error_of(coll, [vs(**kw)]))


def test_dimension_mismatch(corpus):
    coll = corpus[0]
    make_index(coll)
    stage = {"$vectorSearch": {"index": "vi", "path": "embedding", "queryVector": [1.0, 2.0],
                               "exact": True, "limit": 3}}  # fmt: skip
    err = error_of(coll, [stage])
    assert f"vector field is indexed with {DIMS} dimensions but queried with 2" in str(err)


def test_unknown_index_returns_nothing(corpus):
    coll = corpus[0]
    make_index(coll)
    stage = vs(exact=True, limit=3)
    stage["$vectorSearch"]["index"] = "nope"
    assert list(coll.aggregate([stage])) == []


# -- index management --------------------------------------------------------------------------


def test_list_update_drop(db):
    make_index(db.items)
    listed = list(db.items.list_search_indexes())
    assert [(i["name"], i["type"], i["status"], i["queryable"]) for i in listed] == [
        ("vi", "vectorSearch", "READY", True)
    ]
    assert listed[0]["latestDefinition"]["fields"][0]["numDimensions"] == DIMS
    with pytest.raises(OperationFailure):
        make_index(db.items)  # same name twice
    new_def = {"fields": [{"type": "vector", "path": "embedding", "numDimensions": 4,
                           "similarity": "euclidean"}]}  # fmt: skip
    db.items.update_search_index("vi", new_def)
    assert list(db.items.list_search_indexes("vi"))[0]["latestDefinition"] == new_def
    db.items.drop_search_index("vi")
    assert list(db.items.list_search_indexes()) == []


@pytest.mark.parametrize("definition,message", [
    ({"fields": []}, '"fields" must be a non-empty array'),
    ({"fields": [{"type": "vector", "path": "e", "numDimensions": 0, "similarity": "cosine"}]},
     "numDimensions\" must be within bounds [1..8192]"),
    ({"fields": [{"type": "vector", "path": "e", "numDimensions": 3, "similarity": "manhattan"}]},
     "must be one of [cosine, dotProduct, euclidean]"),
    ({"fields": [{"type": "filter", "path": "a"}]}, 'at least one field of type "vector"'),
])  # fmt: skip
def test_invalid_definitions(db, definition, message):
    with pytest.raises(OperationFailure) as info:
        db.items.create_search_index(
            SearchIndexModel(definition=definition, name="bad", type="vectorSearch")
        )
    assert message in str(info.value)


def test_dropping_the_collection_drops_its_search_indexes(db):
    make_index(db.items)
    db.items.drop()
    assert list(db.items.list_search_indexes()) == []


# -- transactions ------------------------------------------------------------------------------


def test_transactional_visibility(client, db):
    coll = db.items
    coll.insert_one({"_id": "seed", "embedding": [0.0] * (DIMS - 1) + [1.0]})
    make_index(coll)
    q = [1.0] + [0.0] * (DIMS - 1)

    def ids(session=None):
        pipeline = [vs(exact=True, limit=10)]
        pipeline[0]["$vectorSearch"]["queryVector"] = q
        return [d["_id"] for d in coll.aggregate(pipeline, session=session)]

    with client.start_session() as s:
        s.start_transaction()
        coll.insert_one({"_id": "aborted", "embedding": q}, session=s)
        assert ids(s)[0] == "aborted"  # own uncommitted write is visible to the transaction
        assert "aborted" not in ids()  # ...and to nobody else
        s.abort_transaction()
    assert "aborted" not in ids()

    with client.start_session() as s:
        s.start_transaction()
        coll.insert_one({"_id": "committed", "embedding": q}, session=s)
        s.commit_transaction()
    assert ids()[0] == "committed"


def test_snapshot_isolation_of_vector_search(client, db):
    coll = db.items
    q = [1.0] + [0.0] * (DIMS - 1)
    coll.insert_one({"_id": "old", "embedding": q})
    make_index(coll)
    pipeline = [vs(exact=True, limit=10)]
    pipeline[0]["$vectorSearch"]["queryVector"] = q
    with client.start_session() as s:
        s.start_transaction()
        assert [d["_id"] for d in coll.aggregate(pipeline, session=s)] == ["old"]
        coll.insert_one({"_id": "later", "embedding": q})  # commits outside the transaction
        coll.delete_one({"_id": "old"})
        # The transaction keeps reading its snapshot: "old" still there, "later" not yet.
        assert [d["_id"] for d in coll.aggregate(pipeline, session=s)] == ["old"]
        s.commit_transaction()
    assert [d["_id"] for d in coll.aggregate(pipeline)] == ["later"]


# -- durability of definitions -----------------------------------------------------------------


@pytest.mark.embedded_only
def test_search_indexes_survive_a_restart(tmp_path):
    from accord.platform.embedded import EmbeddedServer

    name = "r_" + uuid.uuid4().hex[:8]
    server = EmbeddedServer(dbpath=tmp_path, port=0, sync=False)
    server.start()
    try:
        c: MongoClient = MongoClient(server.uri)
        coll = c[name].items
        coll.insert_many([{"_id": i, "embedding": [float(i), 1.0] + [0.0] * (DIMS - 2)}
                          for i in range(1, 20)])  # fmt: skip
        make_index(coll, "euclidean")
        before = [d["_id"] for d in coll.aggregate([vs(exact=True, limit=5)])]
        c.close()
    finally:
        server.stop()
    server = EmbeddedServer(dbpath=tmp_path, port=0, sync=False)
    server.start()
    try:
        # The matrix was built at start-up, before any command asked for it.
        indexes = vector_search.loaded(server.engine)
        assert indexes is not None and len(indexes.build_seconds) == 1
        (state,) = indexes.by_ns[f"{name}.items"].values()
        assert len(state.matrices["embedding"]) == 19
        c = MongoClient(server.uri)
        coll = c[name].items
        assert [i["name"] for i in coll.list_search_indexes()] == ["vi"]
        assert [d["_id"] for d in coll.aggregate([vs(exact=True, limit=5)])] == before
        c.close()
    finally:
        server.stop()
