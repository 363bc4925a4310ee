"""Schemathesis against the HTTP API's own OpenAPI schema, through the ASGI app: valid
and invalid requests generated from the schema (hypothesis) must get answers the schema
declares (status, content type, body), never a server error, and invalid ones must be
rejected with a 4xx (schemathesis's default checks).

It failed intermittently (its examples are random) on ``GET /v1/namespaces`` in the
negative phase. The cause was this test: it replaced the generated credentials at call
time, and schemathesis judged the generated, malformed Authorization header it never
sent, so a case whose other mutation was valid once sent (a non-string query value sent
as its text) counted as "invalid data accepted". The key is now an auth provider (below).
Two API gaps showed up on the way and are fixed: ``prefix``/``suffix`` accepted any string
in the schema while the API refuses NUL, empty or over-long labels (the schema now has
the namespace pattern), and a query parameter given several times (``?suffix=a&suffix=b``)
was answered for its last value (now a 422, ``single_valued_query``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pymongo import MongoClient
from schemathesis import GenerationMode
from schemathesis.auths import AuthStorage

from accord.memory.http_api import create_app
from accord.memory.principals import ApiKeys, Principal, new_key

pytestmark = pytest.mark.slow

KEY = new_key()

#: The test's credentials, as schemathesis's auth provider: set on every generated case in
#: place of generated ones, and known to its checks as the caller's own (valid) key. (Given
#: as a header override at call time instead, schemathesis judged the generated, malformed
#: header it replaced: "invalid data accepted" whenever the rest of the case was valid as
#: sent.) Authentication itself is tested in test_http_api.py, and by schemathesis's
#: ignored_auth check, which removes or spoils this key and expects a 401.
AUTH: AuthStorage[str] = AuthStorage()


@AUTH()
class BearerKey:
    def get(self, case: Any, context: Any) -> str:
        return KEY

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_answers_as_its_schema_says(
    mongo_uri: str, client: MongoClient, mode: GenerationMode
) -> None:
    db = "fuzz_" + uuid.uuid4().hex[:10]
    keys = ApiKeys([Principal(name="fuzz", tenant="F", key=KEY)])
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(
        mongo_uri, keys=keys, db_name=db, dims=32))  # fmt: skip
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 7
    try:
        for operation in operations:
            if mode == GenerationMode.NEGATIVE and operation.path == "/healthz":
                continue  # no input to get wrong

            @given(case=operation.as_strategy(generation_mode=mode, auth_storage=AUTH))
            # more negative examples: about half of them spoil the credentials (a 401)
            @settings(max_examples=20 if mode == GenerationMode.POSITIVE else 50, deadline=None,
                      suppress_health_check=list(HealthCheck), database=None)  # fmt: skip
            def check(case: Any) -> None:
                body = case.body if isinstance(case.body, dict) else {}
                stored = body.get("value") if case.method == "PUT" else None
                if mode == GenerationMode.POSITIVE and _beyond_int64(stored):
                    # JSON Schema cannot say "integers fit in 64 bits"; the API refuses them
                    # (MongoDB cannot store them) instead of rounding them to a double.
                    response = case.call()
                    assert response.status_code == 422 and "64 bits" in response.text
                    return
                response = case.call()
                made_up = mode == GenerationMode.POSITIVE and "after" in (case.query or {})
                if made_up and response.status_code == 400:
                    # nor "a cursor this API issued": a made-up one of the right alphabet
                    # and length is refused naming it (a real one is tested in
                    # test_http_api.py, test_history_is_served_a_page_at_a_time)
                    assert "after: is not a history cursor" in response.text
                    return
                if mode == GenerationMode.NEGATIVE and response.status_code == 413:
                    # a body beyond the route's byte limit (e.g. a query over its maxLength
                    # in 4-byte characters) is refused before it is parsed: 413 is that
                    # refusal, which schemathesis's list of rejections lacks
                    assert "nothing was read or written" in response.text
                    return
                case.validate_response(response)

            check()
    finally:
        client.drop_database(db)


def _beyond_int64(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -(2**63) <= value < 2**63
    if isinstance(value, dict):
        return any(_beyond_int64(v) for v in value.values())
    if isinstance(value, list):
        return any(_beyond_int64(v) for v in value)
    return False
