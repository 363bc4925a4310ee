"""``accord memory worker|status|dead|requeue|api-key`` and ``accord serve`` as a user runs
them (child processes on the session's server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from pymongo import MongoClient

from accord.memory.principals import ApiKeys, hash_key
from accord.platform.synchronous.unit_of_work import UnitOfWork
from tests.memory.serving import accord_serve
from tests.memory.steps import commit_step

ACCORD = [sys.executable, "-m", "accord.platform.cli"]


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "cli_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def run(
    *args: str, env: dict[str, str] | None = None, columns: str | None = None
) -> subprocess.CompletedProcess[str]:
    width = {"COLUMNS": columns} if columns else {}
    return subprocess.run([*ACCORD, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {}), **width})  # fmt: skip


@pytest.mark.slow
def test_worker_status_dead_requeue(mongo_uri: str, client: MongoClient, db_name: str) -> None:
    uow = UnitOfWork(client)
    commit_step(uow, db_name, "acme", "t1", "c1", [("human", "I prefer green tea.")])
    commit_step(uow, db_name, "acme", "t1", "c2", [("human", "Remember that I fly on Monday.")])
    env = {"MONGODB_URI": mongo_uri, "ACCORD_DATABASE": db_name}
    status = json.loads(run("memory", "status", "--json", env=env).stdout)
    assert status["backlog"] == 2 and status["lag_samples"] == 0
    worked = run("memory", "worker", "--drain", env=env)
    assert worked.returncode == 0, worked.stderr
    assert '"done": 2' in worked.stderr
    texts = {d["text"] for d in client[db_name].long_term_memory.find()}
    assert {"User prefers green tea", "I fly on Monday"} <= texts
    status = json.loads(run("memory", "status", "--json", env=env).stdout)
    assert status["backlog"] == 0 and status["lag_samples"] == 2 and status["lag_p95"] > 0
    table = run("memory", "status", env=env)
    assert "backlog" in table.stdout and "lag p95" in table.stdout
    # a dead event, listed and requeued
    client[db_name].outbox.update_one({}, {"$set": {"status": "dead", "error": "boom"}})
    listed = run("memory", "dead", env=env, columns="80")
    assert "boom" in listed.stdout and "acme" in listed.stdout
    dead_id = client[db_name].outbox.find_one({"status": "dead"})["_id"]
    assert str(dead_id) in listed.stdout  # whole, to requeue it by id (it was cut at 80)
    assert "name the events" in run("memory", "requeue", env=env).stderr
    requeued = run("memory", "requeue", "--all-dead", env=env)
    assert "requeued 1 dead event(s)" in requeued.stdout
    event = client[db_name].outbox.find_one({"_id": {"$exists": True}, "attempts": 0})
    assert event is not None and event["status"] == "pending" and "error" not in event


def test_worker_configuration_errors(mongo_uri: str) -> None:
    bad = run("memory", "worker", "--drain", "--extractor", "magic", env={"MONGODB_URI": mongo_uri})
    assert bad.returncode == 2 and "--extractor is 'rules' or 'llm:" in bad.stderr


def test_an_llm_extractor_that_cannot_be_built_is_a_configuration_error() -> None:
    from accord.errors import ConfigurationError
    from accord.memory.cli import extractor_from

    pytest.importorskip("langchain.chat_models")
    with pytest.raises(ConfigurationError, match="--extractor llm:nosuchprovider:m"):
        extractor_from("llm:nosuchprovider:m")  # was LangChain's own error, a traceback


def test_api_key_prints_a_key_and_its_entry() -> None:
    made = run("memory", "api-key", "--tenant", "acme", "--name", "bot", "--read-only")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.split()
    key = lines[0]
    assert key.startswith("acc_") and f'key_sha256 = "{hash_key(key)}"' in made.stdout
    assert 'scopes = ["read"]' in made.stdout and 'tenant = "acme"' in made.stdout
    assert (
        "may not start with '$'" in run("memory", "api-key", "--tenant", "$x", "--name", "n").stderr
    )
    expiring = run("memory", "api-key", "--tenant", "acme", "--name", "b", "--expires-in-days", "2")
    entry = expiring.stdout.split("\n", 1)[1]
    loaded = ApiKeys.parse(tomllib.loads(entry), "test")
    (who,) = loaded.principals
    assert who.expires_at is not None and not who.expired()
    assert who.expired(datetime.now(UTC) + timedelta(days=3))


def test_serve(mongo_uri: str, db_name: str, tmp_path: Path) -> None:
    key = "k" * 30
    keys = tmp_path / "keys.toml"
    keys.write_text(
        f'[[principals]]\nname = "t"\ntenant = "acme"\nkey_sha256 = "{hash_key(key)}"\n'
    )
    with accord_serve(mongo_uri, db_name, keys) as served:
        auth = {"Authorization": f"Bearer {key}"}
        r = httpx.put(f"{served.base}/v1/memories/notes/n1", headers=auth, json={"value": {"x": 1}})
        assert r.status_code == 200 and r.json()["version"] == 1
        assert httpx.get(f"{served.base}/v1/memories/notes/n1").status_code == 401
    assert key not in served.output and hash_key(key) not in served.output


def test_serve_without_keys_refuses_to_start(mongo_uri: str) -> None:
    env = {"MONGODB_URI": mongo_uri, "ACCORD_API_KEYS": "", "ACCORD_API_KEYS_FILE": ""}
    refused = run("serve", env=env)
    assert refused.returncode == 2 and "no API keys configured" in refused.stderr
