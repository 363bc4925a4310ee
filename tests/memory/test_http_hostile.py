"""The HTTP door against a hostile tenant (a second pass, sending real requests): the
holes it found stay closed. A path's namespace and key are read from the route's own
place in the path (a key that spells another route is still a key), a path that is not
UTF-8 once percent-decoded is a 400 (not two keys folded into one U+FFFD), a body with a
field given twice is a 422 (not the last one silently), ``GET /v1/namespaces`` takes the
offsets search takes, of concurrent deletes of one memory one answers that it deleted it,
a label may start with ``/``, and a path's lengths are the store's limits, not the
router's."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from pymongo import MongoClient

from accord.memory.http_api import create_app
from accord.memory.principals import ApiKeys, Principal, new_key

KEY_A, KEY_B = new_key(), new_key()


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "httph_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


@pytest.fixture()
def api(mongo_uri: str, db_name: str) -> Iterator[TestClient]:
    keys = ApiKeys([Principal(name="a", tenant="A", key=KEY_A),
                    Principal(name="b", tenant="B", key=KEY_B)])  # fmt: skip
    with TestClient(create_app(mongo_uri, keys=keys, db_name=db_name, dims=32)) as c:
        yield c


def h(key: str = KEY_A) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def test_a_key_that_spells_another_route_stays_a_key(api: TestClient) -> None:
    """``/v1/history/ns/v1/memories/other/k`` is the history of key ``v1/memories/other/k``
    in ``ns``; it was read as the history of key ``k`` in ``other``."""
    for value in ({"v": 1}, {"v": 2}):
        assert (
            api.put("/v1/memories/other/k", headers=h(), json={"value": value}).status_code == 200
        )
    assert api.put("/v1/memories/ns/v1/memories/other/k", headers=h(),
                   json={"value": {"mine": 1}}).status_code == 200  # fmt: skip
    hist = api.get("/v1/history/ns/v1/memories/other/k", headers=h())
    assert hist.status_code == 200, hist.text
    assert (hist.json()["namespace"], hist.json()["key"]) == (["ns"], "v1/memories/other/k")
    assert hist.json()["items"] == []  # that memory was never replaced; other/k was
    assert len(api.get("/v1/history/other/k", headers=h()).json()["items"]) == 1


@pytest.mark.parametrize("path", [
    "/v1/memories/docs/%FF", "/v1/memories/docs/%FE", "/v1/memories/%C3/k",
    "/v1/memories/docs/a%ED%A0%80",  # an encoded lone surrogate
])  # fmt: skip
def test_a_path_that_is_not_utf8_is_refused(api: TestClient, path: str) -> None:
    """``%FF`` and ``%FE`` both decoded to U+FFFD: two keys sent, one memory written."""
    for method in ("GET", "PUT", "DELETE"):
        r = api.request(method, path, headers=h(), json={"value": {"v": 1}})
        assert r.status_code == 400, (method, r.status_code, r.text)
        assert r.json()["error"] == "invalid_input"
        assert "UTF-8" in r.json()["detail"]
    hist = api.get(path.replace("/v1/memories/", "/v1/history/"), headers=h())
    assert hist.status_code == 400, hist.text
    assert api.get("/v1/namespaces", headers=h()).json()["items"] == []  # nothing written


@pytest.mark.parametrize("body", [
    b'{"limit": 1, "limit": 2}',
    b'{"filter": {"a": 1, "a": {"$ne": 1}}}',
    b'{"namespace_prefix": ["users", "b"], "namespace_prefix": []}',
])  # fmt: skip
def test_a_search_field_given_twice_is_refused(api: TestClient, body: bytes) -> None:
    """A proxy or a WAF in front may read the first of two equal names and accord the last:
    the body means two things. It is refused, as a repeated query parameter is."""
    r = api.post("/v1/search", headers=h(), content=body)
    assert r.status_code == 422, r.text
    assert "given twice" in r.json()["detail"]


def test_a_value_field_given_twice_writes_nothing(api: TestClient) -> None:
    r = api.put("/v1/memories/docs/k", headers=h(),
                content=b'{"value": {"role": "user", "role": "admin"}}')  # fmt: skip
    assert r.status_code == 422, r.text
    assert "'role' given twice" in r.json()["detail"]
    assert api.get("/v1/memories/docs/k", headers=h()).status_code == 404


def test_namespaces_offset_is_bounded_as_search_offset(api: TestClient) -> None:
    r = api.get("/v1/namespaces?offset=99999999999999999999999999", headers=h())
    assert r.status_code == 422, r.text
    assert api.get("/v1/namespaces?offset=10000", headers=h()).status_code == 200


def delete_after(api: TestClient, start: threading.Barrier) -> bool:
    start.wait()
    r = api.delete("/v1/memories/r/d", headers=h())
    assert r.status_code == 200, r.text
    return bool(r.json()["deleted"])


def test_of_concurrent_deletes_one_says_it_deleted(api: TestClient) -> None:
    """Each DELETE read the memory, then deleted it: six at once all answered
    ``deleted: true``, though one deleted it (and one history entry records it)."""
    for round_ in range(3):
        assert (
            api.put("/v1/memories/r/d", headers=h(), json={"value": {"v": round_}}).status_code
            == 200
        )
        start = threading.Barrier(6)
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(delete_after, [api] * 6, [start] * 6))
        assert answers.count(True) == 1, answers
    changes = [e["change"] for e in api.get("/v1/history/r/d", headers=h()).json()["items"]]
    assert changes == ["delete"] * 3


def test_a_label_that_starts_with_a_slash_is_reachable(api: TestClient) -> None:
    """A label may hold ``/`` (sent as ``%2F``), first character included; the router saw
    ``/v1/memories//team/profile`` (an empty segment) and answered a route-less 404."""
    r = api.put("/v1/memories/%2Fteam.a%2F/profile", headers=h(), json={"value": {"v": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["namespace"] == ["/team", "a/"] and r.json()["key"] == "profile"
    for path in ("/v1/memories/%2Fteam.a%2F/profile", "/v1/history/%2Fteam.a%2F/profile"):
        assert api.get(path, headers=h()).status_code == 200, path
    assert api.delete("/v1/memories/%2Fteam.a%2F/profile", headers=h()).json() == {"deleted": True}
    # an empty namespace is the store's refusal, said as such (it was the router's 404)
    r = api.get("/v1/memories//profile", headers=h())
    assert r.status_code == 400 and "non-empty" in r.json()["detail"], r.text


def test_path_lengths_are_the_stores_not_the_routers(api: TestClient) -> None:
    """The router's segments are not the namespace and the key when a label holds ``/``:
    a 900-character key after a label starting with ``/`` was refused as a key over
    1,024 characters, and 20 labels of 250 (the store takes 32 of 256) as a path
    segment over 4,096."""
    cases = [
        ("%2F" + "n" * 200, "k" * 900, ["/" + "n" * 200]),
        (".".join(["l" * 250] * 20), "k", ["l" * 250] * 20),
    ]
    for ns, key, labels in cases:
        r = api.put(f"/v1/memories/{ns}/{key}", headers=h(), json={"value": {"v": 1}})
        assert r.status_code == 200, r.text[:300]
        assert (r.json()["namespace"], r.json()["key"]) == (labels, key)
        assert api.get(f"/v1/memories/{ns}/{key}", headers=h()).status_code == 200
    # beyond the store's limits: its 400, naming the field
    r = api.get("/v1/memories/docs/" + "k" * 1025, headers=h())
    assert r.status_code == 400 and r.json()["detail"].startswith("key:"), r.text[:300]
    r = api.get("/v1/memories/" + ".".join(["l"] * 33) + "/k", headers=h())
    assert r.status_code == 400 and r.json()["detail"].startswith("namespace:"), r.text[:300]
    prefix = ".".join(["l" * 250] * 20)  # 5,019 characters: a namespace the store takes
    r = api.get(f"/v1/namespaces?prefix={prefix}", headers=h())
    assert r.status_code == 200 and r.json()["items"] == [["l" * 250] * 20], r.text[:300]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-8-sig"])
def test_a_body_that_is_not_plain_utf8_is_refused(api: TestClient, encoding: str) -> None:
    """JSON is UTF-8 without a byte order mark (RFC 8259); Python's reader also guessed
    UTF-16 and UTF-32, where the nesting check, which reads the bytes as UTF-8, can be
    fooled: a character whose UTF-16 bytes hold a quote (U+2200: 00 22) hid 500 levels of
    nesting from it."""
    hidden = '{"query": "\u2200", "filter": {"a": ' + '{"b": ' * 500 + "1" + "}" * 501 + "}"
    for text in ('{"query": "x"}', hidden):
        body = text.encode(encoding)
        r = api.post("/v1/search", headers=h(), content=body)
        assert r.status_code == 422, r.text[:300]
        assert "UTF-8" in r.json()["detail"], r.text[:300]
    put = api.put("/v1/memories/docs/k", headers=h(), content='{"value": {}}'.encode(encoding))
    assert put.status_code == 422, put.text[:300]
    assert api.get("/v1/memories/docs/k", headers=h()).status_code == 404


def test_no_kinds_is_not_every_kind(api: TestClient) -> None:
    """``kinds`` narrows to those kinds; an empty list (a client's "the kinds this user
    may see", computed empty) answered every kind."""
    assert api.put("/v1/memories/docs/k", headers=h(), json={"value": {"v": 1}}).status_code == 200
    r = api.post("/v1/search", headers=h(), json={"kinds": []})
    assert r.status_code == 422, r.text[:300]
    assert "kinds" in r.json()["detail"] and "at least one" in r.json()["detail"]
    both = api.post("/v1/search", headers=h(), json={"kinds": ["item"]}).json()["items"]
    assert [m["key"] for m in both] == ["k"]


def test_two_different_keys_in_one_request_are_refused(api: TestClient) -> None:
    """``Authorization`` and ``X-API-Key`` with keys of two tenants: the Bearer one was
    served, silently (a gateway adding its own key to a client's request served the
    client's tenant). Two keys that disagree are a 401; the same key twice is served."""
    assert api.put("/v1/memories/docs/k", headers=h(), json={"value": {"v": 1}}).status_code == 200
    both = {"Authorization": f"Bearer {KEY_B}", "X-API-Key": KEY_A}
    r = api.get("/v1/namespaces", headers=both)
    assert r.status_code == 401, r.text
    assert "two different API keys" in r.json()["detail"]
    same = {"Authorization": f"Bearer {KEY_A}", "X-API-Key": KEY_A}
    assert api.get("/v1/namespaces", headers=same).json()["items"] == [["docs"]]
    # one header twice: the first or the last? (a gateway may check the other one)
    for name, a, b in (("X-API-Key", KEY_A, KEY_B), ("Authorization", f"Bearer {KEY_B}",
                                                     f"Bearer {KEY_A}")):  # fmt: skip
        r = api.get("/v1/namespaces", headers=[(name, a), (name, b)])
        assert r.status_code == 401 and "more than once" in r.json()["detail"], r.text
    # a key in the URL is refused even beside a header key (it was served as the header's)
    r = api.get(f"/v1/namespaces?api_key={KEY_B}", headers=h())
    assert r.status_code == 401 and "in the URL" in r.json()["detail"], r.text
    r = api.get(f"/v1/namespaces?{KEY_B}", headers=h())
    assert r.status_code == 401, r.text


@pytest.mark.parametrize(("method", "path"), [
    ("PUT", "/v1/memories/team%2Falice"), ("DELETE", "/v1/memories/team%2Falice"),
    ("GET", "/v1/memories/team%2Falice"), ("GET", "/v1/history/users%2Fbob"),
    ("PUT", "/v1/%6Demories/team%2Falice/profile"),
])  # fmt: skip
def test_a_path_the_router_splits_otherwise_is_refused(
    api: TestClient, method: str, path: str
) -> None:
    """The router decodes ``%2F`` before it matches: ``team%2Falice`` (one label, no key)
    was served as namespace ``team``, key ``alice``; an encoded route moved a label into
    the key."""
    assert (
        api.put("/v1/memories/team/alice", headers=h(), json={"value": {"v": 1}}).status_code == 200
    )
    r = api.request(method, path, headers=h(), json={"value": {"v": 2}})
    assert r.status_code == 400, (r.status_code, r.text)
    assert r.json()["error"] == "invalid_input"
    got = api.get("/v1/memories/team/alice", headers=h()).json()
    assert got["value"] == {"v": 1}  # untouched
    assert api.get("/v1/namespaces", headers=h()).json()["items"] == [["team"]]


@pytest.mark.parametrize("query", ["prefix=%FF", "suffix=%FE", "limit=5&prefix=a%C3"])
def test_a_query_that_is_not_utf8_is_refused(api: TestClient, query: str) -> None:
    """``prefix=%FF`` and ``prefix=%FE`` were both served as U+FFFD."""
    r = api.get(f"/v1/namespaces?{query}", headers=h())
    assert r.status_code == 400, r.text
    assert "UTF-8" in r.json()["detail"]
    assert api.get("/v1/namespaces?prefix=%C3%A9", headers=h()).status_code == 200
