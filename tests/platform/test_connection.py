"""accord.platform.connect(): the embedded engine is started once, shared, and outlives clients."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pymongo import MongoClient

from accord.errors import DataDirLockedError, EngineStartError, PortInUseError
from accord.platform import connect, connect_async, ensure_engine, stop_engine
from accord.platform.connection import read_lock, spawn_engine
from accord.platform.embedded import EmbeddedServer

pytestmark = pytest.mark.embedded_only


@pytest.fixture()
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("MONGODB_URI", raising=False)
    directory = tmp_path / "data"
    yield directory
    stop_engine(directory)


def test_connect_starts_an_engine_and_reuses_it(data_dir: Path) -> None:
    first = connect(data_dir=data_dir)
    first.accord.c.insert_one({"_id": 1})
    pid, port = read_lock(data_dir) or (0, 0)
    assert pid and port
    second = connect(data_dir=data_dir)
    assert second.accord.c.find_one({"_id": 1}) == {"_id": 1}
    assert read_lock(data_dir) == (pid, port), "a second connect must reuse the running engine"
    first.close()
    second.close()


def test_engine_outlives_a_sigkilled_client_and_keeps_its_commits(data_dir: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys
        from accord.platform import connect
        c = connect(data_dir={str(data_dir)!r})
        c.accord.c.insert_one({{"_id": "from-child"}})
        print("inserted", flush=True)
        sys.stdin.read()  # wait to be killed
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"inserted"
    child.send_signal(signal.SIGKILL)
    child.wait()
    found = read_lock(data_dir)
    assert found is not None, "the engine must keep running after its starter died"
    os.kill(found[0], 0)
    client = connect(data_dir=data_dir)
    assert client.accord.c.find_one({"_id": "from-child"}) == {"_id": "from-child"}
    client.close()


def test_concurrent_starters_share_one_engine(data_dir: Path) -> None:
    script = f"from accord.platform import ensure_engine; print(ensure_engine({str(data_dir)!r}))"
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE) for _ in range(4)
    ]
    uris = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(uris) == 1, f"every starter must get the same engine, got {uris}"


def test_mongodb_uri_wins_over_the_embedded_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EmbeddedServer(tmp_path / "other", port=0, sync=False) as server:
        monkeypatch.setenv("MONGODB_URI", server.uri)
        client = connect(data_dir=tmp_path / "unused")
        client.accord.c.insert_one({"_id": 1})
        assert not (tmp_path / "unused").exists(), (
            "no embedded engine may start when MONGODB_URI is set"
        )
        assert MongoClient(server.uri).accord.c.count_documents({}) == 1
        client.close()


def test_async_twin_returns_an_async_client(data_dir: Path) -> None:
    import asyncio

    async def main() -> dict:
        client = connect_async(data_dir=data_dir)
        try:
            await client.accord.c.insert_one({"_id": "async"})
            return await client.accord.c.find_one({"_id": "async"})
        finally:
            await client.close()

    assert asyncio.run(main()) == {"_id": "async"}


def test_second_engine_on_the_same_dbpath_is_refused(tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path, port=0, sync=False):
        with pytest.raises(DataDirLockedError, match="in use by another accord engine"):
            EmbeddedServer(tmp_path, port=0, sync=False).start()
        proc = subprocess.run(
            [sys.executable, "-m", "accord.platform.embedded", "--dbpath", str(tmp_path), "--port", "0"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 100  # mongod's exit code for a data directory in use
        assert "in use by another accord engine" in proc.stderr


def test_engine_binds_loopback_by_default(tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path, port=0, sync=False) as server:
        assert server.host == "127.0.0.1"
        assert server.bound_host == "127.0.0.1"


def test_restart_recovers_data_indexes_and_validators(tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path, port=0) as server:
        c: MongoClient = MongoClient(server.uri)
        c.d.create_collection("v", validator={"$jsonSchema": {"required": ["x"]}})
        c.d.v.create_index("x", unique=True)
        c.d.v.insert_many([{"x": i} for i in range(100)])
        c.d.v.delete_one({"x": 5})
        c.close()
    with EmbeddedServer(tmp_path, port=0) as server:
        c = MongoClient(server.uri)
        assert c.d.v.count_documents({}) == 99
        assert [d["x"] for d in c.d.v.find({}, {"_id": 0}).limit(3)] == [0, 1, 2], (
            "natural order kept"
        )
        assert "x_1" in c.d.v.index_information()
        with pytest.raises(Exception, match="duplicate key"):
            c.d.v.insert_one({"x": 1})
        with pytest.raises(Exception, match="Document failed validation"):
            c.d.v.insert_one({"y": 1})
        c.close()


def test_ensure_engine_reports_a_clear_error_when_the_engine_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.delenv("MONGODB_URI", raising=False)
    start = time.monotonic()
    with pytest.raises(EngineStartError, match="cannot use .* as the engine's data directory"):
        ensure_engine(blocker / "data", timeout=20)
    assert time.monotonic() - start < 20


def test_transaction_older_than_its_lifetime_is_aborted_and_discarded(tmp_path: Path) -> None:
    from pymongo.errors import OperationFailure

    with EmbeddedServer(tmp_path, port=0, sync=False, transaction_lifetime=1.0) as server:
        client: MongoClient = MongoClient(server.uri)
        with client.start_session() as s:
            s.start_transaction()
            client.d.c.insert_one({"_id": "stale"}, session=s)
            time.sleep(2.5)  # the housekeeping pass aborts it meanwhile
            with pytest.raises(OperationFailure) as info:
                s.commit_transaction()
            assert info.value.code == 251  # NoSuchTransaction
        assert client.d.c.find_one({"_id": "stale"}) is None
        client.d.c.insert_one({"_id": "stale"})  # its lock was released too
        client.close()


def test_an_engine_that_does_not_stop_is_reported_with_its_log(tmp_path: Path) -> None:
    """``stop_engine`` gives up after its timeout with an error that says where the
    engine's log is and how it ends, so a slow or stuck stop can be told apart."""
    from accord.platform.connection import ENGINE_LOG
    from accord.platform.embedded.discovery import LOCK_FILE

    ready = tmp_path / "ready"
    # A fake engine: holds the data directory's lock as the engine does, ignores SIGTERM.
    holder = textwrap.dedent(f"""
        import fcntl, os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        fd = os.open({str(tmp_path / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, b"%d 1\\n" % os.getpid(), 0)
        with open({str(tmp_path / ENGINE_LOG)!r}, "a") as log:
            log.write("shutdown: the housekeeping thread is still busy after 5 s\\n")
        open({str(ready)!r}, "w").close()
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(EngineStartError) as raised:
            stop_engine(tmp_path, timeout=0.5)
        message = str(raised.value)
        assert f"engine pid {proc.pid} did not stop within 0.5s" in message
        assert str(tmp_path / ENGINE_LOG) in message
        assert "the housekeeping thread is still busy" in message
    finally:
        proc.kill()
        proc.wait()


def test_an_engine_that_lost_the_race_to_start_does_not_start_later(tmp_path: Path) -> None:
    """Starters race: one's engine takes the data directory, another's is still starting
    when that starter finds the winner and returns. The late engine must not take the
    directory over once the winner stops (it did: `accord engine stop` ended one engine,
    and another, that nobody was told about, was serving the directory a moment later)."""
    from accord.platform.connection import spawn_engine

    directory = tmp_path / "data"
    winner = EmbeddedServer(directory, port=0, sync=False).start()
    try:
        uri = spawn_engine(directory, port=0, host="127.0.0.1", sync=False, timeout=30)
        assert f":{winner.port}/" in uri  # the engine already serving it
    finally:
        winner.stop()
    time.sleep(3.0)  # longer than a spawned engine takes to start here
    late = read_lock(directory)
    if late is not None:
        stop_engine(directory)
    assert late is None, f"engine pid {late[0]} started after the winner stopped"


def test_a_stale_lock_file_does_not_name_the_engine_that_replaces_it(tmp_path: Path) -> None:
    """A SIGKILLed engine leaves its pid and port in the lock file. The engine started
    next must not be reported by them while it starts (its starter returned the dead
    engine's port, and took the new engine for another starter's)."""
    from accord.platform.embedded.discovery import LOCK_FILE

    directory = tmp_path / "data"
    # Data to load, so that the next engine is seen starting (without, the window is
    # shorter than ``spawn_engine``'s poll).
    with EmbeddedServer(directory, port=0, sync=False) as server:
        client: MongoClient = MongoClient(server.uri)
        client.t.c.insert_many([{"i": i, "pad": "p" * 200} for i in range(30_000)])
        client.close()
    (directory / LOCK_FILE).write_text("999999 1\n")
    uri = ensure_engine(directory, sync=False)
    try:
        found = read_lock(directory)
        assert found is not None and found[1] != 1 and f":{found[1]}/" in uri
        with MongoClient(uri, serverSelectionTimeoutMS=5000) as client:
            assert client.admin.command("ping")["ok"] == 1
    finally:
        stop_engine(directory)


def test_starting_an_engine_says_where_which_port_and_how_to_stop_it(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="accord.platform.connection"):
        connect(data_dir=data_dir).close()
        connect(data_dir=data_dir).close()  # reusing the running engine says nothing
    said = [r for r in caplog.records if r.name == "accord.platform.connection"]
    # a WARNING: shown with no logging set up (an INFO line was seen by nobody)
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    pid, port = read_lock(data_dir) or (0, 0)
    line = said[0].getMessage()
    assert str(data_dir.resolve()) in line and f":{port}" in line and f"pid {pid}" in line
    assert f"accord engine stop --dbpath {data_dir.resolve()}" in line


def test_a_failed_start_says_why_at_once(tmp_path: Path) -> None:
    """The engine process's own error, not "did not start within 20s; see engine.log":
    here data files the engine refuses (an emptied database file after an unclean stop)."""
    (tmp_path / "mongod.lock").write_text("12345 27027\n")  # the last stop was not clean
    (tmp_path / "accord-engine.sqlite3").write_bytes(b"")
    started = time.monotonic()
    with pytest.raises(EngineStartError, match="is empty") as caught:
        spawn_engine(tmp_path, port=0, host="127.0.0.1", sync=False, timeout=20)
    assert "--repair" in str(caught.value)
    assert time.monotonic() - started < 10


def test_a_busy_port_is_refused_before_starting_a_process(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(PortInUseError, match="address already in use"):
            spawn_engine(tmp_path, port=port, host="127.0.0.1", sync=False, timeout=20)
    assert time.monotonic() - started < 10  # not the start timeout (20 s)
    assert not (tmp_path / "engine.log").exists()  # no engine process was started
