"""The index image: a clean shutdown writes every secondary index's entries, the next
start restores them instead of rebuilding, and anything that does not describe exactly
the data being loaded is ignored (the indexes are rebuilt as before).

Each test compares the indexes an engine restored with the ones a start without an image
builds from the documents: entries (keys, versions, documents, order), unique-key owners
and the multikey flag.
"""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bson.decimal128 import Decimal128

from accord.platform.embedded import index_image
from accord.platform.embedded.dispatch import Dispatcher
from accord.platform.embedded.engine import Engine

pytestmark = pytest.mark.embedded_only


def _run(engine: Engine, cmd: dict[str, Any]) -> dict[str, Any]:
    reply = Dispatcher(engine, lambda c: {"ok": 1.0}).execute({**cmd, "$db": "t"})
    assert reply.get("ok") == 1 and not reply.get("writeErrors"), reply
    return reply


def _close(engine: Engine) -> None:
    with engine.locked("shutdown"):
        engine.close()


def _fill(dbpath: Path) -> None:
    dbpath.mkdir()
    engine = Engine(dbpath, sync=False, history_window=300.0)
    _run(engine, {"createIndexes": "c", "indexes": [
        {"key": {"g": 1, "k": -1}, "name": "g_k"},
        {"key": {"k": 1}, "name": "k", "unique": True},
        {"key": {"tags": 1}, "name": "tags"},  # multikey
        {"key": {"s": 1}, "name": "s_ci", "unique": True, "sparse": True,
         "collation": {"locale": "en", "strength": 2}},
        {"key": {"d": 1}, "name": "d", "partialFilterExpression": {"d": {"$gt": 5}}},
    ]})  # fmt: skip
    docs: list[dict[str, Any]] = []
    for i in range(400):
        doc: dict[str, Any] = {"_id": i, "g": i % 5, "k": i, "d": i % 11}
        if i % 3 == 0:
            doc["tags"] = [f"t{i % 4}", i % 7]
        if i % 4 == 0:
            doc["s"] = f"Name{i}"
        if i % 50 == 0:
            doc["k"] = Decimal128(f"{i}.5")
        docs.append(doc)
    _run(engine, {"insert": "c", "documents": docs})
    _run(engine, {"createIndexes": "other", "indexes": [{"key": {"x": 1}, "name": "x"}]})
    _run(engine, {"insert": "other", "documents": [{"_id": i, "x": -i} for i in range(50)]})
    # Updates and deletes leave older versions behind until garbage collection: the
    # image keeps the newest only.
    _run(engine, {"update": "c", "updates": [{"q": {"g": 1}, "u": {"$set": {"d": 99}, "$inc": {"g": 10}}, "multi": True}]})  # fmt: skip
    _run(engine, {"delete": "c", "deletes": [{"q": {"g": 2}, "limit": 0}]})
    _close(engine)


def _state(engine: Engine) -> dict[str, Any]:
    """Every secondary index, as comparable data (records by id key, not identity)."""
    out: dict[str, Any] = {}
    for ns, coll in engine.collections.items():
        for name, index in coll.indexes.items():
            if index.is_id:
                continue
            out[f"{ns}/{name}"] = (
                [(*e[:-3], e[-1].key, e[-3], e[-2]) for e in index.entries],
                dict(coll.unique_maps.get(name, {})),
                index.multikey,
            )
    return out


def _rebuilt_state(dbpath: Path, tmp_path: Path) -> dict[str, Any]:
    """What a start without an image builds, from a copy of the data directory."""
    copy = tmp_path / "rebuilt"
    shutil.copytree(dbpath, copy)
    index_image.discard(copy)
    engine = Engine(copy, sync=False)
    try:
        return _state(engine)
    finally:
        _close(engine)


@pytest.fixture()
def dbpath(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "db"
    _fill(path)
    yield path


def test_a_clean_shutdown_writes_an_image_that_the_next_start_restores(
    dbpath: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert index_image.path_in(dbpath).exists()
    expected = _rebuilt_state(dbpath, tmp_path)
    engine = Engine(dbpath, sync=False)
    try:
        assert not index_image.path_in(dbpath).exists(), "read once, deleted at start"
        assert _state(engine) == expected
        assert "rebuilding" not in caplog.text and "did not match" not in caplog.text
        decimal_keys = [
            e
            for e in engine.collections["t.c"].indexes["k"].entries
            if e[0][0] == 10 and not isinstance(e[0][2], int)
        ]
        assert decimal_keys, "Decimal128 keys (decimal.Decimal in the image) restored"
        # The restored indexes serve queries and enforce uniqueness as rebuilt ones do.
        got = _run(engine, {"find": "c", "filter": {"tags": "t1"}, "sort": {"_id": 1}})
        assert [d["_id"] for d in got["cursor"]["firstBatch"]] == [
            i for i in range(0, 400, 3) if i % 4 == 1 and i % 5 != 2
        ]
        reply = Dispatcher(engine, lambda c: {"ok": 1.0}).execute(
            {"insert": "c", "documents": [{"_id": 1000, "s": "NAME4"}], "$db": "t"}
        )
        assert reply["writeErrors"][0]["code"] == 11000  # equal to Name4 under the collation
    finally:
        _close(engine)
    engine = Engine(dbpath, sync=False)
    try:
        assert _state(engine) == expected  # and again after that shutdown
    finally:
        _close(engine)


def test_an_image_of_other_data_is_ignored(
    dbpath: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old_image = index_image.path_in(dbpath).read_bytes()
    engine = Engine(dbpath, sync=False)
    _run(engine, {"update": "c", "updates": [{"q": {"_id": 3}, "u": {"$set": {"g": 77}}}]})
    _close(engine)
    index_image.path_in(dbpath).write_bytes(old_image)  # the image from before that write
    expected = _rebuilt_state(dbpath, tmp_path)
    engine = Engine(dbpath, sync=False)
    try:
        assert _state(engine) == expected
        assert "not of this data" in caplog.text
    finally:
        _close(engine)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty"])
def test_a_damaged_image_is_ignored(
    dbpath: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    path = index_image.path_in(dbpath)
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[len(data) // 2] ^= 0xFF
    elif damage == "garbage":
        data = bytearray(b"not an image at all" * 10)
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    expected = _rebuilt_state(dbpath, tmp_path)
    engine = Engine(dbpath, sync=False)
    try:
        assert _state(engine) == expected
        assert "rebuilding the indexes" in caplog.text
    finally:
        _close(engine)


def test_an_image_that_does_not_match_the_documents_is_not_used(
    dbpath: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A well-formed image of the right timestamp whose content disagrees with the
    documents (one entry names a document that is not there; another collection's count
    differs) is not used for those collections."""
    engine = Engine(dbpath, sync=False)
    last_ts = engine.storage.last_ts
    _close(engine)
    image = index_image.take(dbpath, last_ts)
    assert image is not None
    image["t.c"].indexes["k"].ids[0] = b"no such document"
    image["t.other"].count += 1
    _write_raw(dbpath, last_ts, image)
    expected = _rebuilt_state(dbpath, tmp_path)
    engine = Engine(dbpath, sync=False)
    try:
        assert _state(engine) == expected
        assert "2 did not match it and were rebuilt" in caplog.text
    finally:
        _close(engine)


def _write_raw(dbpath: Path, last_ts: int, image: dict[str, index_image.CollectionImage]) -> None:
    """Write ``image`` as the engine would (same format), whatever it says."""
    raw = {
        ns: (c.count, {name: (i.spec, i.multikey, i.keys, i.ids, i.owners) for name, i in c.indexes.items()})
        for ns, c in image.items()
    }  # fmt: skip
    index_image.store(dbpath, pickle.dumps((last_ts, raw), protocol=pickle.HIGHEST_PROTOCOL))


def test_an_image_holding_anything_but_plain_values_is_refused(
    dbpath: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The image is a cache in the data directory: loading it must never construct
    arbitrary objects (a pickle could otherwise run code)."""
    engine = Engine(dbpath, sync=False)
    last_ts = engine.storage.last_ts
    _close(engine)
    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self) -> Any:
            return (Path.touch, (marker,))

    index_image.store(dbpath, pickle.dumps((last_ts, {"t.c": (1, {"k": Boom()})})))
    expected = _rebuilt_state(dbpath, tmp_path)
    engine = Engine(dbpath, sync=False)
    try:
        assert _state(engine) == expected
        assert not marker.exists()
        assert "unreadable" in caplog.text
    finally:
        _close(engine)


def test_after_a_crash_the_image_is_not_used(dbpath: Path, tmp_path: Path) -> None:
    """An unclean shutdown (the engine is told the last one was) discards the image:
    the data may have moved on since it was written."""
    assert index_image.path_in(dbpath).exists()
    engine = Engine(dbpath, sync=False, expect_durable=True)
    try:
        assert not index_image.path_in(dbpath).exists()
        assert _state(engine) == _rebuilt_state(dbpath, tmp_path)
    finally:
        _close(engine)
