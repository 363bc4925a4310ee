"""`accord engine start|status|stop` as a user runs them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from pymongo import MongoClient

from accord.platform.connection import read_lock
from accord.platform.embedded import EmbeddedServer
from accord.platform.embedded.discovery import DEFAULT_PORT

pytestmark = [pytest.mark.embedded_only, pytest.mark.slow]  # engines started as processes
ACCORD = [sys.executable, "-m", "accord.platform.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ACCORD, *args], capture_output=True, text=True, timeout=60)


def test_engine_start_status_stop(tmp_path: Path) -> None:
    dbpath = str(tmp_path / "db")
    assert run("engine", "status", "--dbpath", dbpath).returncode == 1
    started = run("engine", "start", "--dbpath", dbpath, "--port", "0")
    assert started.returncode == 0, started.stderr
    assert "engine started: mongodb://127.0.0.1:" in started.stdout
    uri = started.stdout.split("engine started: ")[1].split()[0]
    try:
        client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=5000)
        client.x.y.insert_one({"ok": True})
        assert client.x.y.count_documents({}) == 1
        client.close()
        status = run("engine", "status", "--dbpath", dbpath)
        assert status.returncode == 0 and "running: pid" in status.stdout
        again = run("engine", "start", "--dbpath", dbpath, "--port", "0")
        assert "already running" in again.stdout
    finally:
        stopped = run("engine", "stop", "--dbpath", dbpath)
    assert "stopped" in stopped.stdout
    assert run("engine", "status", "--dbpath", dbpath).returncode == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--port", "70000"],
        ["--port", "abc"],
        ["--bogus"],
        # NaN passed `<= 0` (TTL passes that never ran); inf never aborted a transaction
        ["--ttl-interval", "nan"],
        ["--transaction-lifetime", "inf"],
        ["--transaction-lifetime", "0"],
    ],
)
def test_engine_start_rejects_bad_flags(tmp_path: Path, args: list[str]) -> None:
    result = run("engine", "start", "--dbpath", str(tmp_path), *args)
    assert result.returncode == 2
    assert not (tmp_path / "mongod.lock").exists()


def test_engine_start_on_an_unusable_dbpath_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run("engine", "start", "--dbpath", str(blocker / "db"), "--port", "0")
    assert result.returncode == 2
    assert "cannot use" in result.stderr and "Traceback" not in result.stdout + result.stderr


def run_env(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ACCORD, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


def test_a_busy_port_is_reported_at_once(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = run("engine", "start", "--dbpath", str(tmp_path / "db"), "--port", str(port))
        elapsed = time.monotonic() - started
    assert result.returncode == 2
    # on stderr, as docs/engine.md says (it was on stdout, where a script reads the URI)
    assert "address already in use" in result.stderr and f"127.0.0.1:{port}" in result.stderr
    assert "--port 0" in result.stderr and not result.stdout  # what to do
    # Not the engine-start timeout (20 s): the time to start a Python process, once.
    assert elapsed < 15, f"took {elapsed:.1f}s"
    assert (tmp_path / "db").exists() and not (tmp_path / "db" / "accord-engine.sqlite3").exists()
    # the failed start left the data directory as it was: a later start works
    ok = run("engine", "start", "--dbpath", str(tmp_path / "db"), "--port", "0")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    run("engine", "stop", "--dbpath", str(tmp_path / "db"))


def test_the_default_port_is_not_mongods() -> None:
    assert DEFAULT_PORT not in (27017, 27018, 27019)
    assert EmbeddedServer(Path("unused"), sync=False).requested_port == DEFAULT_PORT
    help_text = run("engine", "start", "--help").stdout
    assert f"default: {DEFAULT_PORT}" in help_text and "27017" in help_text  # says why


def test_engine_ls_lists_running_engines_and_forgets_dead_ones(tmp_path: Path) -> None:
    env = {"ACCORD_ENGINES_DIR": str(tmp_path / "engines")}
    first, second = tmp_path / "a", tmp_path / "b"
    assert run_env("engine", "ls", env=env).stdout.strip() == "no engine running"
    for d in (first, second):
        assert (
            run_env("engine", "start", "--dbpath", str(d), "--port", "0", env=env).returncode == 0
        )
    try:
        listed = run_env("engine", "ls", env=env).stdout.splitlines()
        assert len(listed) == 2, listed
        for d, line in zip((first, second), listed, strict=True):
            pid, port = read_lock(d) or (0, 0)
            assert line.startswith(str(d.resolve()))
            assert f"127.0.0.1:{port}" in line and f"pid {pid}" in line
        os.kill((read_lock(second) or (0, 0))[0], signal.SIGKILL)  # no clean stop
        deadline = time.monotonic() + 10
        while read_lock(second) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        listed = run_env("engine", "ls", env=env).stdout.splitlines()
        assert len(listed) == 1 and listed[0].startswith(str(first.resolve())), listed
    finally:
        run_env("engine", "stop", "--dbpath", str(first), env=env)
    assert run_env("engine", "ls", env=env).stdout.strip() == "no engine running"
    assert list((tmp_path / "engines").glob("*.json")) == []


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"accord {version('accord')}"


@pytest.mark.parametrize(
    "command",
    [["--help"], ["engine", "start", "--help"], ["memory", "worker", "--help"],
     ["memory", "api-key", "--help"], ["serve", "--help"]],
)  # fmt: skip
def test_help_shows_flags_as_flags_and_no_markup(command: list[str]) -> None:
    result = subprocess.run(
        [*ACCORD, *command], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout and "``" not in result.stdout, result.stdout
    assert "--help" in result.stdout
