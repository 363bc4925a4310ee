"""The ``accord`` command line under bad input (2026-12-07): each refusal is one line
naming the value, exit code non-zero, nothing written, no traceback, and no option reaches
accord's own collections or a server the user did not name."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from typer.testing import CliRunner, Result

from accord.platform import connection
from accord.platform.cli import app

BAD_UTF8 = "\udcff"  # what Python makes of the byte 0xff on a command line


@pytest.fixture()
def db_name(client: MongoClient) -> Iterator[str]:
    name = "badcli_" + uuid.uuid4().hex[:10]
    try:
        yield name
    finally:
        client.drop_database(name)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def refused(result: Result, *words: str, code: int = 2) -> None:
    """``result`` is a refusal: exit ``code``, no exception escaped, its output names
    ``words``."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == code, result.output
    for word in words:
        assert word in result.output, result.output


# --- accord engine start -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # '' bound every interface (0.0.0.0) and printed the URI 'mongodb://:PORT'
        (["--host", ""], "--host"),
        (["--host", " 127.0.0.1"], "--host"),
        # inf passed min=0: every snapshot read at a cluster time then failed in the
        # engine with an internal OverflowError; NaN was called "below 0"
        (["--snapshot-history-window", "inf"], "from 0 to a day"),
        (["--snapshot-history-window", "nan"], "from 0 to a day"),
        (["--snapshot-history-window", "1e12"], "from 0 to a day"),
        # no upper bound before 2026-12-07: past the open-file limit the cap never acted
        # (accept() failed with EMFILE, the engine could not open its own files)
        (["--max-conns", "100000000"], "--max-conns"),
        (["--max-conns", "0"], "from 1 to"),
        # printed without its control characters: the path shown was another one
        (["--dbpath", "bad\nname"], "--dbpath"),
        (["--dbpath", "bad\x1b[31mname"], "control character"),
    ],
)
def test_engine_start_refuses_an_unusable_host_or_window(
    tmp_path: Path, args: list[str], named: str
) -> None:
    dbpath = tmp_path / "db"
    try:
        result = invoke("engine", "start", "--dbpath", str(dbpath), "--port", "0", *args)
    finally:
        connection.stop_engine(dbpath)
    refused(result, named)
    assert not (dbpath / "mongod.lock").exists()
    assert not any(tmp_path.iterdir())  # no data directory made, whatever it was named


def test_the_engine_refuses_more_connections_than_files_it_may_open(tmp_path: Path) -> None:
    from accord.errors import EngineStartError
    from accord.platform.embedded.server import EmbeddedServer, connection_limit

    assert 1 <= connection_limit() <= 65_536
    with pytest.raises(EngineStartError, match="max_connections must be from 1 to"):
        EmbeddedServer(tmp_path, port=0, sync=False, max_connections=connection_limit() + 1)


# --- any command: a bad setting is a usage error (exit 2) ----------------------------------


#: a command of each family that reads the settings (before 2026-12-07 a bad one exited 1
#: from runs, worker, threads and governance, 2 from the others)
_FAMILIES = [
    ["runs", "ls"],
    ["runs", "calls"],
    ["worker", "--graph", "tests.durable.queue_graphs:approval", "--until-idle"],
    ["threads", "show", "t1"],
    ["threads", "gc-artifacts"],
    ["governance", "holds"],
    ["memory", "dead"],
    ["audit", "digest"],
    ["checkpoints", "migrate"],
]


@pytest.mark.parametrize("args", _FAMILIES, ids=lambda a: "-".join(a[:2]))
@pytest.mark.parametrize(
    ("variable", "value"),
    [("ACCORD_SERVER_SELECTION_TIMEOUT", "-1"), ("MONGODB_URI", "mongodb://localhost:99999/")],
)
def test_a_bad_setting_exits_2_from_every_command_family(
    args: list[str], variable: str, value: str
) -> None:
    result = CliRunner().invoke(app, args, env={variable: value})
    refused(result, variable if variable != "MONGODB_URI" else "cannot use the MongoDB URI")
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output


def test_an_unreachable_server_is_an_operational_failure_exit_1() -> None:
    # (memory exited 2 for it before 2026-12-07, the others 1)
    env = {"MONGODB_URI": "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=100"}
    for args in (["memory", "dead"], ["runs", "ls"], ["threads", "show", "t1"]):
        refused(CliRunner().invoke(app, args, env=env), "unreachable", code=1)


# --- any command: an exception no command expected -----------------------------------------


#: ``accord ARGS`` in a child whose connect() has a bug: an exception no command expects
#: (before, rich printed a traceback of about 40 lines for one, such as pymongo's plain
#: ValueError for a port past 65535, now a ConfigurationError of its own)
_BUGGY = """
import sys
import accord.platform, accord.platform.connection
def connect(*args, **kwargs):
    raise RuntimeError("a bug in connect")
accord.platform.connect = accord.platform.connection.connect = connect
from accord.platform.cli import app
app(sys.argv[1:], prog_name="accord")
"""


def test_an_unexpected_error_is_one_line_and_its_traceback_is_at_debug() -> None:
    command = [sys.executable, "-c", _BUGGY]
    run = subprocess.run([*command, "runs", "ls"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr and "╭" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "RuntimeError: a bug in connect" in lines[0], run.stderr
    assert "accord --debug" in lines[0]
    debug = subprocess.run([*command, "--debug", "runs", "ls"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_a_port_past_65535_is_one_line_naming_the_uri() -> None:
    env = {**os.environ, "MONGODB_URI": "mongodb://localhost:99999/"}
    run = subprocess.run([sys.executable, "-m", "accord.platform.cli", "runs", "ls"],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert run.returncode == 2  # a bad setting: a usage error (1 before 2026-12-07)
    (line,) = run.stderr.strip().splitlines()
    assert "cannot use the MongoDB URI 'mongodb://localhost:99999/'" in line
    assert "Port must be an integer" in line


# --- accord runs: values that are not UTF-8 ------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "ls", "--thread", BAD_UTF8],
        ["runs", "ls", "--tenant", BAD_UTF8],
        ["runs", "show", BAD_UTF8],
        ["runs", "cancel", BAD_UTF8],
        ["runs", "calls", "--thread", BAD_UTF8],
        ["runs", "submit", "mod:graph", "--key", BAD_UTF8],
        ["runs", "resolve", "t1", BAD_UTF8, "--result", "1"],
    ],
)
def test_runs_refuse_values_that_are_not_utf8(
    mongo_uri: str, client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch,
    args: list[str],
) -> None:  # fmt: skip
    # (pymongo's UnicodeEncodeError traceback, after the command had connected)
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    refused(invoke(*args, "--db", db_name), "not valid UTF-8")
    assert db_name not in client.list_database_names()


def test_runs_submit_refuses_a_lone_surrogate_in_its_json(
    mongo_uri: str, client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (JSON's "\ud800" decoded to a lone surrogate; the run was queued with it)
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    result = invoke("runs", "submit", "mod:graph", "--input", '{"a": "\\ud800"}', "--db", db_name)
    refused(result, "--input", "lone surrogate", "nothing was written")
    assert db_name not in client.list_database_names()


# --- accord threads show|release --runs-collection -------------------------------------------


@pytest.mark.parametrize("collection", ["accord_policies", "accord_audit", "accord_catalog"])
def test_threads_release_never_writes_into_accords_own_collections(
    mongo_uri: str, client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch,
    collection: str,
) -> None:  # fmt: skip
    # (a lease document was written into accord_policies, and show read accord_audit)
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    for command in ("show", "release"):
        result = invoke("threads", command, "t1", "--db", db_name, "--runs-collection", collection)
        refused(result, collection, "not a run registry")
    assert client[db_name][collection].count_documents({}) == 0


def test_threads_release_refuses_a_collection_the_catalog_gives_another_class(
    mongo_uri: str, client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an application named its outbox 'app_events': the catalog says so
    client[db_name]["accord_catalog"].insert_one(
        {"_id": "app_events", "artifact": "outbox", "component": "test"}
    )
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    result = invoke("threads", "release", "t1", "--db", db_name, "--runs-collection", "app_events")
    refused(result, "'outbox'", "catalog")  # a bad flag: 2 (1 before 2026-12-07)
    assert client[db_name]["app_events"].count_documents({}) == 0


@pytest.mark.parametrize("collection", ["", "$x", "system.users", "a."])
def test_threads_show_refuses_a_registry_that_is_no_collection_name(
    mongo_uri: str, monkeypatch: pytest.MonkeyPatch, collection: str
) -> None:
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    refused(invoke("threads", "show", "t1", "--runs-collection", collection), "collection name")


# --- accord checkpoints migrate ---------------------------------------------------------------


@pytest.mark.parametrize("target", ["a.b", "", "x y"])
def test_migrate_checks_its_target_database(
    mongo_uri: str, client: MongoClient, db_name: str, target: str
) -> None:
    # ('a.b' was pymongo's InvalidName traceback; '' silently meant --db)
    client[db_name]["checkpoints"].insert_one({"thread_id": "t1"})
    result = invoke(
        "checkpoints", "migrate", "--db", db_name, "--to-db", target, "--uri", mongo_uri
    )
    refused(result, "--to-db")
    assert "accord_migrations" not in client[db_name].list_collection_names()


@pytest.mark.parametrize(
    "args", [["--checkpoints", "accord_run_queue"], ["--writes", "accord_checkpoints"]]
)
def test_migrate_never_reads_accords_own_collections_as_mongodbsavers(
    mongo_uri: str, client: MongoClient, db_name: str, args: list[str]
) -> None:
    # (the run queue was read as checkpoints and recorded as a migrated MongoDBSaver
    # collection in accord_migrations)
    client[db_name]["accord_run_queue"].insert_one({"thread_id": "t1"})
    client[db_name]["checkpoints"].insert_one({"thread_id": "t1"})
    result = invoke("checkpoints", "migrate", "--db", db_name, "--uri", mongo_uri, *args)
    refused(result, "accord's own", "nothing was read or written")
    assert "accord_migrations" not in client[db_name].list_collection_names()


# --- accord memory ------------------------------------------------------------------------------


def test_memory_requeue_refuses_ids_with_all_dead(
    mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the ids were ignored and every dead event was requeued)
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    refused(invoke("memory", "requeue", "ev1", "--all-dead", "--db", db_name), "not both")


def test_memory_requeue_refuses_an_id_that_is_not_utf8(
    mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    refused(invoke("memory", "requeue", BAD_UTF8, "--db", db_name), "not valid UTF-8")


def test_memory_api_key_names_a_bad_name_in_one_line() -> None:
    # (pydantic's four lines and a web address)
    result = invoke("memory", "api-key", "--tenant", "acme", "--name", "")
    refused(result, "name:")
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "pydantic.dev" not in result.output


def test_memory_uri_and_dbpath_together_are_refused(
    mongo_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (--dbpath was ignored: the command ran on --uri's server; --uri '' meant MONGODB_URI)
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    result = invoke("memory", "status", "--uri", mongo_uri, "--dbpath", str(tmp_path))
    refused(result, "--uri and --dbpath")
    assert not (tmp_path / "mongod.lock").exists()
    refused(invoke("memory", "status", "--uri", ""), "--uri is empty")


def test_memory_dbpath_wins_over_mongodb_uri(
    mongo_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/memory.md: the flags win over MONGODB_URI; --dbpath was ignored while it was set
    engines: list[Path] = []

    def engine_of(data_dir: Path) -> str:  # the engine of --dbpath: the session's server
        engines.append(Path(data_dir))
        return mongo_uri

    monkeypatch.setattr(connection, "ensure_engine", engine_of)
    monkeypatch.setenv("MONGODB_URI", "mongodb://127.0.0.1:1/")  # nothing listens there
    monkeypatch.setenv("ACCORD_SERVER_SELECTION_TIMEOUT", "1")
    result = invoke("memory", "status", "--json", "--dbpath", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert engines == [tmp_path]


@pytest.mark.parametrize(
    "args",
    [
        ["governance", "hold", BAD_UTF8, "--by", "tenant"],
        ["governance", "hold", "t1", "--by", "thread", "--tenant", BAD_UTF8],
        ["governance", "release", BAD_UTF8, "--by", "subject"],
        ["governance", "erase", BAD_UTF8, "--yes"],
        ["governance", "export-subject", "u-1", "--tenant", BAD_UTF8, "--out", "x"],
        ["governance", "shred-tenant", BAD_UTF8, "--yes"],
        ["audit", "export", "--tenant", BAD_UTF8, "--out", "x"],
    ],
    ids=["hold", "hold-tenant", "release", "erase", "export-subject", "shred-tenant", "audit"],
)
def test_governance_text_that_is_not_utf8_is_refused_before_connecting(args: list[str]) -> None:
    # Before: pymongo's UnicodeEncodeError after connecting (shred-tenant: "a tenant is a
    # non-empty string of at most 1024 characters", about a short non-empty value).
    env = {"MONGODB_URI": "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=100"}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert "is not valid UTF-8" in result.output
    assert "Traceback" not in result.output
