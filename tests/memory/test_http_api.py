"""The HTTP door, through its ASGI app (FastAPI's TestClient runs the app's lifespan and
event loop in process): routes, pagination, errors, API keys, and tenant isolation,
including filters and bodies crafted to widen the scope."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pymongo import MongoClient

from accord.errors import ConfigurationError
from accord.memory import principals
from accord.memory.http_api import create_app
from accord.memory.principals import ApiKeys, Principal, hash_key, new_key

KEY_A, KEY_B, KEY_A_READ = new_key(), new_key(), new_key()


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "http_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def keys() -> ApiKeys:
    return ApiKeys([
        Principal(name="a", tenant="A", key=KEY_A),
        Principal(name="b", tenant="B", key_sha256=hash_key(KEY_B)),
        Principal(name="a-read", tenant="A", key=KEY_A_READ, scopes=frozenset({"read"})),
    ])  # fmt: skip


@pytest.fixture()
def api(mongo_uri: str, db_name: str) -> Iterator[TestClient]:
    app = create_app(mongo_uri, keys=keys(), db_name=db_name, dims=64)
    with TestClient(app) as c:
        yield c


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def put(api: TestClient, key: str, ns: str, k: str, value: dict[str, Any], **extra: Any) -> Any:
    r = api.put(f"/v1/memories/{ns}/{k}", headers=h(key), json={"value": value, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_put_get_search_history_delete(api: TestClient) -> None:
    first = put(api, KEY_A, "users.u1", "food", {"likes": "ramen"}, text="likes ramen")
    assert first["version"] == 1 and first["namespace"] == ["users", "u1"]
    assert first["provenance"]["source"] == "http"
    put(api, KEY_A, "users.u1", "food", {"likes": "udon"}, text="likes udon noodles")
    put(
        api,
        KEY_A,
        "users.u1",
        "seat",
        {"pref": "aisle"},
        text="prefers aisle seats",
        kind="preference",
    )
    got = api.get("/v1/memories/users.u1/food", headers=h(KEY_A)).json()
    assert got["value"] == {"likes": "udon"} and got["version"] == 2
    hits = api.post("/v1/search", headers=h(KEY_A),
                    json={"namespace_prefix": ["users"], "query": "udon noodles"}).json()  # fmt: skip
    assert hits["items"][0]["key"] == "food" and hits["items"][0]["score"] > 0
    prefs = api.post("/v1/search", headers=h(KEY_A), json={"kinds": ["preference"]}).json()
    assert [m["key"] for m in prefs["items"]] == ["seat"]
    filtered = api.post("/v1/search", headers=h(KEY_A),
                        json={"filter": {"likes": {"$in": ["udon", "soba"]}}}).json()  # fmt: skip
    assert [m["key"] for m in filtered["items"]] == ["food"]
    hist = api.get("/v1/history/users.u1/food", headers=h(KEY_A)).json()
    assert [(e["version"], e["change"], e["value"]) for e in hist["items"]] == [
        (1, "update", {"likes": "ramen"})
    ]
    assert api.delete("/v1/memories/users.u1/food", headers=h(KEY_A)).json() == {"deleted": True}
    assert api.delete("/v1/memories/users.u1/food", headers=h(KEY_A)).json() == {"deleted": False}
    r = api.get("/v1/memories/users.u1/food", headers=h(KEY_A))
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    changes = [
        e["change"] for e in api.get("/v1/history/users.u1/food", headers=h(KEY_A)).json()["items"]
    ]
    assert changes == ["update", "delete"]


def test_history_is_served_a_page_at_a_time(api: TestClient) -> None:
    for i in range(7):
        put(api, KEY_A, "users.u1", "food", {"n": i})
    seen, after = [], None
    for _ in range(5):
        query = "?limit=3" + (f"&after={after}" if after else "")
        page = api.get(f"/v1/history/users.u1/food{query}", headers=h(KEY_A)).json()
        assert len(page["items"]) <= 3
        seen += [e["value"]["n"] for e in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert seen == [0, 1, 2, 3, 4, 5]
    # the first page by default, with its cursor; B's key with A's cursor sees nothing
    first = api.get("/v1/history/users.u1/food?limit=3", headers=h(KEY_A)).json()
    assert first["next"] is not None
    theirs = api.get(f"/v1/history/users.u1/food?after={first['next']}", headers=h(KEY_B))
    assert theirs.status_code == 200 and theirs.json()["items"] == []


def test_keys_with_slashes_and_unicode(api: TestClient) -> None:
    put(api, KEY_A, "docs", "a/b/c ü", {"x": 1})
    assert api.get("/v1/memories/docs/a/b/c ü", headers=h(KEY_A)).json()["key"] == "a/b/c ü"


def test_pagination(api: TestClient) -> None:
    for i in range(5):
        put(api, KEY_A, f"p.n{i}", "k", {"i": i}, index=False)
    page1 = api.post("/v1/search", headers=h(KEY_A), json={"limit": 2}).json()
    page2 = api.post("/v1/search", headers=h(KEY_A), json={"limit": 2, "offset": 2}).json()
    page3 = api.post("/v1/search", headers=h(KEY_A), json={"limit": 2, "offset": 4}).json()
    assert (page1["next_offset"], page2["next_offset"], page3["next_offset"]) == (2, 4, None)
    seen = [m["namespace"][1] for p in (page1, page2, page3) for m in p["items"]]
    assert sorted(seen) == [f"n{i}" for i in range(5)]
    ns1 = api.get("/v1/namespaces?prefix=p&limit=3", headers=h(KEY_A)).json()
    ns2 = api.get("/v1/namespaces?prefix=p&limit=3&offset=3", headers=h(KEY_A)).json()
    assert ns1["next_offset"] == 3 and ns2["next_offset"] is None
    assert ns1["items"] + ns2["items"] == [["p", f"n{i}"] for i in range(5)]
    depth = api.get("/v1/namespaces?max_depth=1", headers=h(KEY_A)).json()
    assert depth["items"] == [["p"]]


def test_api_keys(api: TestClient) -> None:
    r = api.post("/v1/search", json={})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert r.json() == {"error": "unauthorized", "detail": r.json()["detail"]}
    assert api.post("/v1/search", headers=h(new_key()), json={}).status_code == 401
    assert api.post("/v1/search", headers={"X-API-Key": KEY_B}, json={}).status_code == 200
    r = api.put("/v1/memories/n/k", headers=h(KEY_A_READ), json={"value": {}})
    assert r.status_code == 403 and "may not write" in r.json()["detail"]
    assert api.delete("/v1/memories/n/k", headers=h(KEY_A_READ)).status_code == 403
    assert api.post("/v1/search", headers=h(KEY_A_READ), json={}).status_code == 200
    assert api.get("/healthz").json() == {"status": "ok"}


def test_tenant_isolation(api: TestClient) -> None:
    put(api, KEY_A, "users.shared", "secret", {"owner": "A", "n": 1}, text="the launch code")
    put(api, KEY_B, "users.shared", "other", {"owner": "B", "n": 2}, text="the launch code")
    # B sees only B, whatever it asks for
    assert api.get("/v1/memories/users.shared/secret", headers=h(KEY_B)).status_code == 404
    for body in (
        {"query": "launch code"},
        {"namespace_prefix": ["users"], "filter": {"owner": "A"}},
        {"filter": {"owner": {"$ne": "B"}}},
        {"filter": {"n": {"$gte": 0}}},
        {"filter": {"tenant_id": "A"}},  # a value field named tenant_id: narrows, never widens
    ):
        items = api.post("/v1/search", headers=h(KEY_B), json=body).json()["items"]
        assert all(m["value"]["owner"] == "B" for m in items), body
    names = api.get("/v1/namespaces", headers=h(KEY_B)).json()["items"]
    assert names == [["users", "shared"]]
    assert api.get("/v1/history/users.shared/secret", headers=h(KEY_B)).json()["items"] == []
    # B deleting A's key touches nothing of A
    assert api.delete("/v1/memories/users.shared/secret", headers=h(KEY_B)).json() == {
        "deleted": False
    }
    assert api.get("/v1/memories/users.shared/secret", headers=h(KEY_A)).status_code == 200
    # B writing A's key writes B's own memory
    put(api, KEY_B, "users.shared", "secret", {"owner": "B"})
    assert (
        api.get("/v1/memories/users.shared/secret", headers=h(KEY_A)).json()["value"]["owner"]
        == "A"
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"filter": {"$where": "this.owner == 'A'"}}, "filter field '$where' is not allowed"),
        ({"filter": {"$or": [{"owner": "A"}, {"owner": "B"}]}}, "'$or' is not allowed"),
        ({"filter": {"owner": {"$regex": ".*"}}}, "'$regex' on 'owner' is not supported"),
        ({"filter": {"owner": {"$in": "A"}}}, "$in on 'owner' needs a list"),
        ({"filter": {"a": {"b": {"$where": "1"}}}}, "not supported"),
        ({"tenant_id": "A"}, "tenant_id: Extra inputs are not permitted"),
        ({"namespace_prefix": ["a.b"]}, "may not contain '.'"),
        ({"namespace_prefix": [""]}, "non-empty strings"),
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"kinds": ["$where"]}, "kinds[0]"),
        ({"recency_weight": 2}, "recency_weight"),
        ({"query": {"$gt": ""}}, "query"),
    ],
)
def test_bad_search_input_is_a_clear_4xx(
    api: TestClient, body: dict[str, Any], fragment: str
) -> None:
    r = api.post("/v1/search", headers=h(KEY_B), json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request" and fragment in r.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "fragment"),
    [
        ("get", "/v1/memories/a..b/k", None, 400, "non-empty strings"),
        ("get", "/v1/memories/a%00b/k", None, 400, "NUL"),
        ("put", "/v1/memories/n/k", {"value": "x"}, 422, "value"),
        ("put", "/v1/memories/n/k", {"value": {}, "tenant_id": "A"}, 422, "tenant_id"),
        ("put", "/v1/memories/n/k", {"value": {}, "kind": "$set"}, 422, "kind"),
        ("put", "/v1/memories/n/k", {"value": {}, "ttl_minutes": -1}, 422, "ttl_minutes"),
        ("get", "/v1/namespaces?limit=0", None, 422, "limit"),
        ("get", "/v1/namespaces?prefix=a..b", None, 400, "non-empty strings"),
        # one value per parameter (the schema's), not the last of several
        ("get", "/v1/namespaces?prefix=p&prefix=q", None, 422, "query.prefix: given 2 times"),
        ("get", "/v1/namespaces?limit=1&limit=2&limit=3", None, 422, "given 3 times"),
        ("get", "/v1/memories/n/k?x=1&x=2", None, 422, "query.x: given 2 times"),
        ("get", "/v1/history/n/k?limit=101", None, 422, "limit"),
        ("get", "/v1/history/n/k?after=", None, 422, "after"),
        ("get", "/v1/history/n/k?after=" + "x" * 97, None, 422, "after"),
        ("get", "/v1/history/n/k?after=a.b", None, 422, "after"),
        ("get", "/v1/history/n/k?after=bm90LWEtY3Vyc29y", None, 400, "after: is not a history"),
    ],
)
def test_bad_input_elsewhere(api: TestClient, method: str, path: str, body: Any, status: int,
                             fragment: str) -> None:  # fmt: skip
    r = api.request(method, path, headers=h(KEY_A), json=body)
    assert r.status_code == status, r.text
    assert fragment in r.json()["detail"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        # pydantic's lax mode would take these; the schema (number, integer, boolean) does not
        ("/v1/memories/n/k", {"value": {}, "ttl_minutes": True}, "ttl_minutes"),
        ("/v1/memories/n/k", {"value": {}, "ttl_minutes": "5"}, "ttl_minutes"),
        ("/v1/memories/n/k", {"value": {}, "index": "yes"}, "index"),
        ("/v1/memories/n/k", {"value": {}, "index": 1}, "index"),
        ("/v1/search", {"limit": True}, "limit"),
        ("/v1/search", {"offset": "2"}, "offset"),
        ("/v1/search", {"offset": 0.5}, "offset"),
        ("/v1/search", {"recency_weight": False}, "recency_weight"),
    ],
)
def test_a_body_field_gets_no_lax_coercion(api: TestClient, path: str, body: Any,
                                           field: str) -> None:  # fmt: skip
    method = "put" if path.startswith("/v1/memories") else "post"
    r = api.request(method, path, headers=h(KEY_A), json=body)
    assert r.status_code == 422, r.text
    assert f"body.{field}" in r.json()["detail"]
    assert api.get("/v1/memories/n/k", headers=h(KEY_A)).status_code == 404  # nothing written


def test_body_numbers_the_schema_allows_are_taken(api: TestClient) -> None:
    # JSON Schema's integer includes 2.0, and a number includes 5
    r = api.put("/v1/memories/n/k", headers=h(KEY_A), json={"value": {"v": 1}, "ttl_minutes": 5})
    assert r.status_code == 200, r.text
    assert r.json()["expires_at"] is not None
    r = api.post("/v1/search", headers=h(KEY_A), json={"limit": 2.0, "offset": 0.0,
                                                         "recency_weight": 1})  # fmt: skip
    assert r.status_code == 200, r.text
    assert [m["key"] for m in r.json()["items"]] == ["k"]


def test_filter_operands_are_what_the_schema_says(api: TestClient) -> None:
    """An operator's operand may be any JSON a document holds (objects included, compared
    as MongoDB compares them), and the schema says its field names have no NUL: CI's
    schemathesis once generated ``{"$lt": {"\x00..": 1}}`` as schema-valid (operands
    were ``Any``) and the API refused it."""
    r = api.post("/v1/search", headers=h(KEY_A),
                 json={"filter": {"v": {"$eq": {}, "$lt": {"a": 1}, "$in": [{"b": [1]}]}}})  # fmt: skip
    assert r.status_code == 200, r.text
    r = api.post("/v1/search", headers=h(KEY_A), json={"filter": {"v": {"$lt": {"\x00a": 1}}}})
    assert r.status_code == 422 and "NUL" in r.text, r.text
    spec = api.get("/openapi.json").json()["components"]["schemas"]
    operators = spec["Operators"]["properties"]
    assert all(operators[op].get("$ref", "").endswith("/JsonValue") for op in ("$eq", "$lt"))
    assert operators["$in"]["items"]["$ref"].endswith("/JsonValue")
    value_keys = spec["JsonValue"]["anyOf"]
    objects = [s for s in value_keys if s.get("type") == "object"]
    assert objects and objects[0]["propertyNames"]["pattern"] == "^[^\\x00]*$"


def test_openapi(api: TestClient) -> None:
    spec = api.get("/openapi.json").json()
    assert {"/v1/search", "/v1/memories/{namespace}/{key}", "/v1/history/{namespace}/{key}",
            "/v1/namespaces", "/healthz"} <= set(spec["paths"])  # fmt: skip
    assert set(spec["paths"]["/v1/memories/{namespace}/{key}"]) == {"get", "put", "delete"}


def test_keys_are_never_logged(api: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    api.post("/v1/search", headers=h(KEY_A), json={})
    api.post("/v1/search", headers=h(KEY_A + "x"), json={})
    api.put("/v1/memories/n/k", headers=h(KEY_A), json={"value": {"v": 1}})
    text = caplog.text + repr(keys().principals)
    assert KEY_A not in text and hash_key(KEY_A) not in text


# -- key configuration -----------------------------------------------------------------------


def test_key_files_and_environment(tmp_path: Any) -> None:
    toml = tmp_path / "keys.toml"
    toml.write_text(f'[[principals]]\nname = "bot"\ntenant = "acme"\nkey_sha256 = "{hash_key(KEY_A)}"\n'
                    f'scopes = ["read"]\n')  # fmt: skip
    loaded = ApiKeys.from_file(toml)
    who = loaded.authenticate(KEY_A)
    assert who is not None and who.tenant == "acme" and who.scopes == {"read"}
    assert loaded.authenticate(KEY_B) is None and loaded.authenticate("") is None
    js = tmp_path / "keys.json"
    js.write_text(json.dumps([{"name": "x", "tenant": "t", "key": KEY_B}]))
    assert ApiKeys.from_file(js).authenticate(KEY_B).tenant == "t"  # type: ignore[union-attr]
    env = {
        principals.KEYS_ENV: json.dumps(
            {"principals": [{"name": "y", "tenant": "u", "key": KEY_B}]}
        )
    }
    assert ApiKeys.from_env(env).authenticate(KEY_B).name == "y"  # type: ignore[union-attr]
    assert ApiKeys.from_env({principals.KEYS_FILE_ENV: str(toml)}).authenticate(KEY_A) is not None


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([{"name": "x", "tenant": "t", "key": "short"}], "shorter than 24"),
        ([{"name": "x", "tenant": "t"}], "needs key_sha256"),
        ([{"name": "x", "tenant": "$t", "key": KEY_A}], "may not start with '$'"),
        ([{"name": "x", "tenant": "t", "key": KEY_A, "scopes": []}], "no scopes"),
        ([{"name": "x", "tenant": "t", "key": KEY_A, "scopes": ["admin"]}], "scopes"),
        ([{"name": "x", "tenant": "t", "key": KEY_A, "role": "root"}], "Extra inputs"),
        ([{"name": "x", "tenant": "t", "key": KEY_A}, {"name": "x", "tenant": "u", "key": KEY_B}],
         "names must be unique"),
        ([{"name": "x", "tenant": "t", "key": KEY_A}, {"name": "y", "tenant": "u", "key": KEY_A}],
         "same key"),
        ({"nope": 1}, "expected a list"),
    ],
)  # fmt: skip
def test_bad_key_configuration(entries: Any, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        ApiKeys.parse(entries, "test")


def test_no_keys_no_api(mongo_uri: str) -> None:
    with pytest.raises(ConfigurationError, match="no API keys configured"):
        ApiKeys.from_env({})
    with pytest.raises(ConfigurationError, match="at least one"):
        create_app(mongo_uri, keys=ApiKeys([]))


def test_every_key_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: a match on the first principal costs as many comparisons as none."""
    calls: list[int] = []
    real = principals.hmac.compare_digest
    monkeypatch.setattr(principals.hmac, "compare_digest",
                        lambda a, b: calls.append(1) or real(a, b))  # fmt: skip
    k = keys()
    for presented in (KEY_A, KEY_A_READ, new_key()):
        calls.clear()
        k.authenticate(presented)
        assert len(calls) == 3
