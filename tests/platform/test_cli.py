"""`accord engine start|status|stop` as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pymongo import MongoClient

pytestmark = pytest.mark.embedded_only
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


@pytest.mark.parametrize("args", [["--port", "70000"], ["--port", "abc"], ["--bogus"]])
def test_engine_start_rejects_bad_flags(tmp_path: Path, args: list[str]) -> None:
    result = run("engine", "start", "--dbpath", str(tmp_path), *args)
    assert result.returncode == 2
    assert not (tmp_path / "mongod.lock").exists()


def test_engine_start_on_an_unusable_dbpath_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run("engine", "start", "--dbpath", str(blocker / "db"), "--port", "0")
    assert result.returncode == 2
    assert "cannot use" in result.stdout and "Traceback" not in result.stdout + result.stderr
