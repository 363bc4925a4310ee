"""What a newcomer meets first in the HTTP API: /docs that work offline, and API keys that
`accord memory api-key --keys-file` adds to a running server without a restart."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pymongo import MongoClient

from accord.memory.http_api import create_app
from accord.memory.principals import ApiKeys

URL = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url:\s*["']([^"']+)["']""")


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "docs_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def api_key(keys_file: Path, name: str, *extra: str) -> str:
    """`accord memory api-key ... --keys-file` as a user runs it; the key it prints."""
    result = subprocess.run(
        [sys.executable, "-m", "accord.platform.cli", "memory", "api-key", "--tenant", "acme",
         "--name", name, "--keys-file", str(keys_file), *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"added {name!r}" in result.stderr
    return result.stdout.strip()


@pytest.fixture()
def served(mongo_uri: str, db_name: str, tmp_path: Path) -> Iterator[tuple[TestClient, Path, str]]:
    keys_file = tmp_path / "keys.toml"
    first = api_key(keys_file, "first")
    app = create_app(mongo_uri, keys=ApiKeys.from_file(keys_file), db_name=db_name, dims=64)
    with TestClient(app) as c:
        yield c, keys_file, first


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_load_nothing_from_another_host(
    served: tuple[TestClient, Path, str], page: str
) -> None:
    api = served[0]
    html = api.get(page)
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    assert "https://" not in html.text and "http://" not in html.text, html.text
    assets = [a or b for a, b in URL.findall(html.text)]
    assert any(a.endswith(".js") for a in assets), assets
    for asset in assets:  # every script, style and icon the page names is served here
        got = api.get(asset)
        assert got.status_code == 200 and len(got.content) > 0, asset


def _eventually(api: TestClient, key: str, status: int) -> Any:
    """The answer to ``key`` once it is ``status``, or after 5 s."""
    deadline = time.monotonic() + 5
    while True:
        got = api.get("/v1/namespaces", headers={"X-API-Key": key})
        if got.status_code == status or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_a_key_added_by_the_cli_works_without_a_restart(
    served: tuple[TestClient, Path, str],
) -> None:
    api, keys_file, first = served
    assert api.get("/v1/namespaces", headers={"X-API-Key": first}).status_code == 200
    second = api_key(keys_file, "second", "--read-only")
    got = _eventually(api, second, 200)  # the file is looked at once a second
    assert got.status_code == 200, got.text
    put = api.put(
        "/v1/memories/notes/k", json={"value": {"text": "x"}}, headers={"X-API-Key": second}
    )
    assert put.status_code == 403  # read-only, as asked
    # removing a principal from the file revokes its key, still without a restart
    text = keys_file.read_text()
    keys_file.write_text(text[: text.index('[[principals]]\nname = "second"')])
    assert _eventually(api, second, 401).status_code == 401
    assert api.get("/v1/namespaces", headers={"X-API-Key": first}).status_code == 200


def test_a_keys_file_broken_by_hand_keeps_the_keys_it_had(
    served: tuple[TestClient, Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    api, keys_file, first = served
    keys_file.write_text(keys_file.read_text() + "\n[[principals]\nname = ")
    deadline = time.monotonic() + 5
    while "stay in force" not in caplog.text and time.monotonic() < deadline:
        assert api.get("/v1/namespaces", headers={"X-API-Key": first}).status_code == 200
        time.sleep(0.1)
    assert "stay in force until it is fixed" in caplog.text


def test_api_key_refuses_a_second_principal_of_the_same_name(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    api_key(keys_file, "bot")
    before = keys_file.read_text()
    result = subprocess.run(
        [sys.executable, "-m", "accord.platform.cli", "memory", "api-key", "--tenant", "acme",
         "--name", "bot", "--keys-file", str(keys_file)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "unique" in result.stderr
    assert keys_file.read_text() == before  # nothing half-written
    assert len(ApiKeys.from_file(keys_file)) == 1
