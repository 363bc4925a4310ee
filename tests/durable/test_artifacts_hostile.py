"""Artifacts given hostile labels, metadata and references: refused with
``InvalidInputError`` naming the field, nothing stored (before 2026-12-07 a lone
surrogate or a 65-bit int was a raw ``UnicodeEncodeError`` / ``OverflowError``, deep
metadata a database refusal, and a reference id with a trailing newline passed the
id check)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient

from accord.errors import InvalidInputError
from accord.platform import gridfs_layout as gl
from tests.checkpointers import conftest as checkpointer_fixtures
from tests.checkpointers.conftest import config

# the checkpointer tests' fixtures: a saver of each kind on a database of its own
kind = checkpointer_fixtures.kind
saver = checkpointer_fixtures.saver
db_name = checkpointer_fixtures.db_name


def _deep(levels: int) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(levels):
        doc = {"a": doc}
    return doc


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"filename": "report\ud800.pdf"}, "filename holds a lone surrogate"),
        ({"content_type": "text/\udfff"}, "content_type holds a lone surrogate"),
        ({"metadata": {"source": "\ud800"}}, "metadata holds a lone surrogate"),
        ({"metadata": {"n": [2**64]}}, "metadata holds an int of more than 64 bits"),
        ({"metadata": _deep(170)}, "metadata is nested more than 100 levels"),
    ],
)
def test_bad_labels_and_metadata(
    client: MongoClient, saver: Any, db_name: str, kwargs: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        saver.put_artifact(config("t"), b"data", **kwargs)
    assert client[db_name][gl.FILES].count_documents({}) == 0
    assert client[db_name][gl.CHUNKS].count_documents({}) == 0


def test_metadata_within_the_limits_is_kept(saver: Any, client: MongoClient, db_name: str) -> None:
    ref = saver.put_artifact(config("t"), b"data", metadata={"deep": _deep(90), "n": 2**62})
    assert saver.get_artifact(ref) == b"data"
    stored = client[db_name][gl.FILES].find_one({"_id": ref.id}) or {}
    assert stored["metadata"]["n"] == 2**62


@pytest.mark.parametrize("field", ["id", "digest"])
def test_a_reference_with_a_trailing_newline_is_refused(saver: Any, field: str) -> None:
    ref = saver.put_artifact(config("t"), b"data").as_dict()
    ref[field] += "\n"
    with pytest.raises(InvalidInputError, match=f"artifact {field} must"):
        saver.get_artifact(ref)
