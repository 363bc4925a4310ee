"""The HTTP door under attack (issue 22, items 3, 5 and 8): error answers bounded and never
echoing the input, nesting and size limits checked while the body is read, a ``/`` in a
namespace label that never crosses into the key, bodies over the limit answered 413, NaN
and Infinity refused, the text cap not bypassed by leaving ``text`` out, a PUT that
answers what it wrote, keys re-read without a restart and expiring, and no key in the
access log."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pymongo import MongoClient

from accord.memory import validation
from accord.memory.http_api import create_app
from accord.memory.http_bodies import MAX_ERROR_BYTES
from accord.memory.json_body import json_depth
from accord.memory.principals import ApiKeys, Principal, hash_key, new_key
from tests.memory.serving import accord_serve

KEY, READER = new_key(), new_key()


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "httpl_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def api(mongo_uri: str, db_name: str) -> Iterator[TestClient]:
    keys = ApiKeys([Principal(name="w", tenant="A", key=KEY),
                    Principal(name="r", tenant="A", key=READER, scopes=frozenset({"read"}))])  # fmt: skip
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name, dims=32)) as c:
        yield c


def h(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def nested_filter(depth: int) -> str:
    """A search body whose filter nests ``depth`` levels (JSON text: Python's encoder
    cannot write 1,000 levels)."""
    return '{"filter": ' + '{"a": ' * depth + '{"$eq": 1}' + "}" * depth + "}"


def nested_value(depth: int) -> str:
    return '{"value": ' + '{"v": ' * depth + "1" + "}" * depth + "}"


# -- item 3: bounded error answers ----------------------------------------------------------


def test_a_deeply_nested_filter_gets_a_small_answer(api: TestClient) -> None:
    """The issue's repro: a 1.8 KB search body with a filter nested 300 deep, sent with a
    read-only key, got a 9.9-26 MB 422."""
    body = nested_filter(300)
    assert len(body) < 2500
    r = api.post("/v1/search", headers=h(READER), content=body)
    assert r.status_code == 422, r.text[:500]
    assert len(r.content) <= MAX_ERROR_BYTES
    assert r.json()["error"] == "invalid_request" and "nested" in r.json()["detail"]
    assert '{"a": {"a"' not in r.text and "'a': {'a'" not in r.text  # the input is not echoed


@pytest.mark.parametrize("depth", [33, 40, 1_000, 7_000, 100_000])
def test_nesting_is_refused_before_parsing(api: TestClient, depth: int) -> None:
    """Depth is checked on the bytes (1,000 levels and more would exhaust the JSON parser
    or the validators' recursion); a value or filter nested over 32 levels inside a body
    that parses is refused by the shared validation, by field. (A search body of 100,000
    levels is over the search's 64 KiB: a 413.)"""
    body = nested_filter(depth)
    r = api.post("/v1/search", headers=h(), content=body)
    assert len(r.content) <= MAX_ERROR_BYTES, r.text[:300]
    if len(body) > 64 * 1024:
        assert r.status_code == 413
    else:
        assert r.status_code == 422 and "nested" in r.json()["detail"], r.text[:300]
    r = api.put("/v1/memories/n/deep", headers=h(), content=nested_value(depth))
    assert r.status_code == 422 and "nested" in r.json()["detail"], r.text[:300]
    assert len(r.content) <= MAX_ERROR_BYTES


def test_an_unterminated_string_is_read_in_one_pass(api: TestClient) -> None:
    """The nesting check strips strings from the bytes before counting brackets. A string
    that never ends, made of escaped quotes (``"x\\"x\\"x\\"...``), made it start again at
    every quote and scan to the end: quadratic, holding the GIL (so every request waited).
    A 63 KB search took about 12 s, a 4 MB PUT hours; now one pass, and a 400/422."""
    body = b'{"query": "' + b'x\\"' * 21_000
    started = time.monotonic()
    r = api.post("/v1/search", headers=h(), content=body)
    assert r.status_code == 422 and "not valid JSON" in r.json()["detail"], r.text[:300]
    assert time.monotonic() - started < 2
    body = b'{"value": {"v": "' + b'x\\"' * 1_000_000
    started = time.monotonic()
    r = api.put("/v1/memories/n/k", headers=h(), content=body)
    assert r.status_code == 422 and "not valid JSON" in r.json()["detail"], r.text[:300]
    assert time.monotonic() - started < 5
    assert json_depth(b'["\\' + b"\n" + b"[[[") == 1  # a backslash before a newline, too


def test_many_problems_are_counted_not_listed(api: TestClient) -> None:
    body = {"value": {}, **{f"extra{i}": "x" * 500 for i in range(200)}}
    r = api.put("/v1/memories/n/k", headers=h(), json=body)
    assert r.status_code == 422 and len(r.content) <= MAX_ERROR_BYTES
    assert "more problem(s)" in r.json()["detail"]
    assert "x" * 100 not in r.text


def test_concurrent_deep_requests_get_small_answers(api: TestClient) -> None:
    """20 of the issue's requests at once: every answer small (237 MB in all, before)."""
    body = nested_filter(300)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: api.post("/v1/search", headers=h(READER),
                                                   content=body), range(20)))  # fmt: skip
    assert {r.status_code for r in answers} == {422}
    assert sum(len(r.content) for r in answers) <= 20 * MAX_ERROR_BYTES
    assert api.get("/healthz").status_code == 200


# -- item 5: a '/' in a label --------------------------------------------------------------


def test_a_slash_in_a_label_stays_in_the_namespace(
    api: TestClient, mongo_uri: str, db_name: str
) -> None:
    r = api.put("/v1/memories/team%2Falice/profile", headers=h(), json={"value": {"v": 1}})
    assert r.status_code == 200, r.text
    assert (r.json()["namespace"], r.json()["key"]) == (["team/alice"], "profile")
    got = api.get("/v1/memories/team%2Falice/profile", headers=h()).json()
    assert got["value"] == {"v": 1}
    assert api.get("/v1/memories/team/alice%2Fprofile", headers=h()).status_code == 404
    assert api.get("/v1/memories/team/alice/profile", headers=h()).status_code == 404
    # the store sees the same address
    from accord.memory.synchronous.service import MemoryService

    svc = MemoryService(MongoClient(mongo_uri), tenant_id="A", db_name=db_name, dims=32)
    found = svc.get(("team/alice",), "profile")
    assert found is not None and found.value == {"v": 1}
    assert svc.get(("team",), "alice/profile") is None
    hist = api.get("/v1/history/team%2Falice/profile", headers=h()).json()
    assert hist["namespace"] == ["team/alice"]
    assert api.delete("/v1/memories/team%2Falice/profile", headers=h()).json() == {"deleted": True}


def test_a_body_must_say_it_is_json(api: TestClient) -> None:
    for headers in ({"Authorization": f"Bearer {KEY}"},
                    {"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"}):  # fmt: skip
        r = api.post("/v1/search", headers=headers, content="{}")
        assert r.status_code == 422 and "Content-Type: application/json" in r.text


def test_keys_keep_their_slashes(api: TestClient) -> None:
    r = api.put("/v1/memories/docs.a/x/y%2Fz", headers=h(), json={"value": {}})
    assert (r.json()["namespace"], r.json()["key"]) == (["docs", "a"], "x/y/z")


# -- item 8: HTTP odds ------------------------------------------------------------------------


def test_bodies_over_the_limit_are_413(api: TestClient) -> None:
    """A PUT over 4 MiB (the issue: 16 MB answered 500) and a search over 64 KiB are
    refused while the body arrives."""
    huge = {"value": {"blob": "x" * (17 * 1024 * 1024)}}
    r = api.put("/v1/memories/n/huge", headers=h(), json=huge)
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"] == "too_large" and "4,194,304 bytes" in r.json()["detail"]
    r = api.post("/v1/search", headers=h(), json={"query": "q", "filter": {"a": "x" * 70_000}})
    assert r.status_code == 413 and "65,536 bytes" in r.json()["detail"]
    assert api.get("/v1/memories/n/huge", headers=h()).status_code == 404


def test_a_value_over_its_encoded_limit_is_422(api: TestClient) -> None:
    r = api.put("/v1/memories/n/big", headers=h(),
                json={"value": {"blob": "y" * (validation.MAX_VALUE_BYTES + 10)}})  # fmt: skip
    assert r.status_code == 422 and "larger than 2,097,152 bytes" in r.json()["detail"]


def test_leaving_text_out_does_not_bypass_the_text_cap(
    api: TestClient, client: MongoClient, db_name: str
) -> None:
    """The value's JSON is what gets embedded when no text is given: it is cut to the text
    cap (the issue: a 7 MB value was stored as a 14 MB document)."""
    value = {"blob": "z" * 1_500_000}
    r = api.put("/v1/memories/n/big", headers=h(), json={"value": value})
    assert r.status_code == 200, r.text[:300]
    doc = client[db_name].long_term_memory.find_one({"key": "big"})
    assert len(doc["text"]) == validation.MAX_TEXT and doc["value"] == value
    r = api.put("/v1/memories/n/big", headers=h(),
                json={"value": {}, "text": "t" * (validation.MAX_TEXT + 1)})  # fmt: skip
    assert r.status_code == 422 and "body.text" in r.json()["detail"]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_numbers_json_does_not_have_are_refused(api: TestClient, number: str) -> None:
    """Python's JSON reader takes them, and they read back as null (the issue)."""
    body = '{"value": {"x": ' + number + "}}"
    r = api.put("/v1/memories/n/nan", headers=h(), content=body)
    assert r.status_code == 422 and "number" in r.json()["detail"], r.text
    assert api.get("/v1/memories/n/nan", headers=h()).status_code == 404
    r = api.post("/v1/search", headers=h(), content='{"recency_weight": ' + number + "}")
    assert r.status_code == 422


def test_a_tiny_ttl_answers_what_was_written(api: TestClient) -> None:
    """The write commits, then expires at once: the answer is the written memory (the
    issue: a 409 'deleted right after it was written' for a write that committed)."""
    r = api.put("/v1/memories/n/brief", headers=h(), json={"value": {"v": 1}, "ttl_minutes": 1e-9})
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 1 and r.json()["expires_at"] is not None
    assert api.get("/v1/memories/n/brief", headers=h()).status_code == 404  # expired


def test_keys_file_changes_apply_without_a_restart(
    mongo_uri: str, db_name: str, tmp_path: Path
) -> None:
    """Adding, revoking and expiring keys in the keys file takes effect on the next
    requests (a second at most), without a restart; a broken file keeps the keys in
    force; an emptied or removed file revokes them all."""
    first, second = new_key(), new_key()
    path = tmp_path / "keys.toml"

    def write(*entries: str) -> None:
        path.write_text("\n".join(entries))
        os.utime(path, ns=(time.time_ns(), time.time_ns()))

    def entry(name: str, key: str, extra: str = "") -> str:
        return (f'[[principals]]\nname = "{name}"\ntenant = "A"\n'
                f'key_sha256 = "{hash_key(key)}"\n{extra}')  # fmt: skip

    write(entry("first", first))
    keys = ApiKeys.from_file(path)
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name, dims=32)) as api:

        def status(key: str) -> int:
            return api.post("/v1/search", headers=h(key), json={}).status_code

        assert (status(first), status(second)) == (200, 401)
        write(entry("first", first), entry("second", second))
        assert keys.reload_if_changed(now=True)
        assert (status(first), status(second)) == (200, 200)
        write(entry("second", second))  # revoke the first
        assert keys.reload_if_changed(now=True)
        assert (status(first), status(second)) == (401, 200)
        write("this is not toml [[")  # a typo: the keys loaded before stay
        assert not keys.reload_if_changed(now=True)
        assert status(second) == 200
        past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
        write(entry("second", second, f"expires_at = {past}"))
        assert keys.reload_if_changed(now=True)
        assert status(second) == 401
        future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        write(entry("second", second, f"expires_at = {future}"))
        deadline = time.monotonic() + 5  # without being asked: at most a second later
        while status(second) != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        path.write_text("")  # emptied, then removed: every key is revoked (fail closed)
        assert keys.reload_if_changed(now=True)
        assert status(second) == 401
        write(entry("second", second))
        assert keys.reload_if_changed(now=True)
        assert status(second) == 200
        path.unlink()
        assert keys.reload_if_changed(now=True)
        assert status(second) == 401


def test_an_expiry_needs_a_time_zone() -> None:
    from accord.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="time zone"):
        ApiKeys.parse([{"name": "x", "tenant": "t", "key": KEY,
                        "expires_at": "2030-01-01T00:00:00"}], "test")  # fmt: skip


def test_a_key_in_the_url_stays_out_of_the_access_log(
    mongo_uri: str, db_name: str, tmp_path: Path
) -> None:
    """The real ``accord serve`` (uvicorn's access log): a key sent as a query parameter
    or a path segment is refused and logged as ``<redacted>``."""
    keys = tmp_path / "keys.toml"
    keys.write_text(
        f'[[principals]]\nname = "t"\ntenant = "acme"\nkey_sha256 = "{hash_key(KEY)}"\n'
    )
    with accord_serve(mongo_uri, db_name, keys) as served:
        assert httpx.get(f"{served.base}/v1/namespaces?api_key={KEY}&limit=5").status_code == 401
        assert httpx.get(f"{served.base}/v1/memories/{KEY}/k").status_code == 401
        # a bare query item, a key as a name, a key inside a segment
        assert httpx.get(f"{served.base}/v1/namespaces?limit=5&{KEY}").status_code == 401
        assert httpx.get(f"{served.base}/v1/namespaces?{KEY}=1").status_code == 401
        assert httpx.get(f"{served.base}/v1/memories/ns.{KEY}/k.json").status_code == 401
    output = served.output
    assert "/v1/namespaces?api_key=<redacted>&limit=5" in output, output
    assert "/v1/memories/<redacted>/k" in output
    assert KEY not in output and hash_key(KEY) not in output
