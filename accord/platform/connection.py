"""``connect()``: a pymongo client for accord, real MongoDB or the embedded engine.

With ``MONGODB_URI`` set, that server is used as is. Otherwise an embedded engine is
started for the data directory, or reused if one already serves it, so several processes
(runtime, aggregator, API, a restarted worker) share one durable store. The engine runs in
its own session (process group): it outlives the client process that started it, even
one killed with SIGKILL. Starting one logs one INFO line (where, which port, how to stop
it); ``accord engine ls`` lists the running ones.

A client from :func:`connect` waits at most ``ACCORD_SERVER_SELECTION_TIMEOUT`` seconds
(5 by default; a URI's own ``serverSelectionTimeoutMS`` wins) for a server, and
:func:`connect` checks that one is found: an unreachable server is a
:class:`~accord.errors.DatabaseUnreachable` naming the hosts, in seconds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from accord.errors import ConfigurationError, EngineStartError, PortInUseError
from accord.platform import reachability
from accord.platform.embedded import discovery
from accord.platform.embedded.discovery import LOCK_FILE, REPLICA_SET
from accord.platform.settings import Settings
from accord.platform.synchronous.reachability import ensure_reachable

ENGINE_LOG = "engine.log"
log = logging.getLogger(__name__)


def read_lock(data_dir: Path) -> tuple[int, int] | None:
    """``(pid, port)`` of the engine serving ``data_dir``, or None if none does."""
    path = data_dir / LOCK_FILE
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            content = os.pread(fd, 100, 0).decode(errors="replace").split()
            if len(content) == 2 and all(p.isdigit() for p in content):
                return int(content[0]), int(content[1])
            return None  # held, no pid and port yet: an engine is starting
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def engine_uri(port: int, host: str = "127.0.0.1") -> str:
    return f"mongodb://{host}:{port}/?replicaSet={REPLICA_SET}"


def ensure_engine(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    sync: bool | None = None,
    timeout: float | None = None,
    enable_test_commands: bool = False,
    auth: bool = False,
) -> str:
    """Start (or find) the embedded engine for ``data_dir`` and return its URI.

    ``enable_test_commands`` starts it with ``--enable-test-commands`` (drivers' spec tests;
    never for production); ``auth`` with ``--auth`` (docs/engine.md, "Authentication and
    roles"). An engine already serving ``data_dir`` is returned as it runs.
    """
    settings = Settings()
    directory = Path(data_dir or settings.data_dir).resolve()
    timeout = timeout or settings.engine_start_timeout
    sync = settings.engine_sync if sync is None else sync
    found = read_lock(directory)
    if found:
        return engine_uri(found[1])
    uri = spawn_engine(
        directory,
        port=0,
        host="127.0.0.1",
        sync=sync,
        timeout=timeout,
        enable_test_commands=enable_test_commands,
        options=["--auth"] if auth else [],
    )
    found = read_lock(directory)
    # WARNING, not INFO: Python shows only warnings unless logging is configured, and a
    # process left running must never be unannounced
    log.warning(
        "accord: started the embedded engine for %s on %s (pid %s); it keeps running after "
        "this process exits. Stop it with: accord engine stop --dbpath %s",
        directory, uri.split("//", 1)[1].split("/", 1)[0], found[0] if found else "?",
        directory,
    )  # fmt: skip
    return uri


def spawn_engine(
    directory: Path,
    *,
    port: int,
    host: str,
    sync: bool,
    timeout: float,
    options: Sequence[str] = (),
    enable_test_commands: bool = False,
) -> str:
    """Start an engine process for ``directory`` in its own session; return its URI.

    ``options`` are further ``accord engine start`` flags (``--ttl-interval 5`` ...).
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EngineStartError(
            f"cannot use {directory} as the engine's data directory: {exc.strerror}"
        ) from exc
    if port:
        _probe_port(host, port)  # at once, before a child spends a second importing
    cmd = [sys.executable, "-m", "accord.platform.embedded", "--dbpath", str(directory)]
    cmd += ["--port", str(port), "--host", host] + ([] if sync else ["--no-sync"])
    cmd += list(options)
    if enable_test_commands and "--enable-test-commands" not in cmd:
        cmd.append("--enable-test-commands")
    with open(directory / ENGINE_LOG, "ab") as engine_log:
        since = engine_log.tell()  # what this engine writes starts here
        proc = subprocess.Popen(
            cmd,
            stdout=engine_log,
            stderr=engine_log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = read_lock(directory)
        if found:
            if found[0] != proc.pid:
                _withdraw(proc)
            return engine_uri(found[1], host)
        code = proc.poll()
        if code is not None and code != discovery.EXIT_DIR_TAKEN:
            raise _start_failed(directory, since, code)
        # EXIT_DIR_TAKEN: another process won the race to start it; poll for its lock.
        time.sleep(0.05)
    raise EngineStartError(
        f"the embedded engine did not start within {timeout}s; see {directory / ENGINE_LOG}"
    )


def resolve_uri(uri: str | None = None, data_dir: str | os.PathLike[str] | None = None) -> str:
    settings = Settings()
    return uri or settings.mongodb_uri or ensure_engine(data_dir)


def _uri_timeout(uri: str) -> bool:
    """Whether ``uri`` sets serverSelectionTimeoutMS; one that is no number of
    milliseconds is a ConfigurationError (pymongo only warns, and waits its 30 s)."""
    query = parse_qs(uri.partition("?")[2], keep_blank_values=True)
    values = [v for k, vs in query.items() if k.lower() == "serverselectiontimeoutms" for v in vs]
    for value in values:
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if not 0 <= ms < math.inf:
            raise ConfigurationError(
                f"cannot use the MongoDB URI {reachability.redact(uri)!r}: its "
                f"serverSelectionTimeoutMS={value!r} is not a number of milliseconds"
            )
    return bool(values)


def client_options(uri: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` plus accord's server-selection timeout, unless the URI or ``kwargs``
    set one (pymongo's own default, 30 s, is long to wait for a typo'd host)."""
    given = {k.lower() for k in kwargs}
    if "serverselectiontimeoutms" in given or _uri_timeout(uri):
        return kwargs
    seconds = Settings().server_selection_timeout
    return {**kwargs, "serverSelectionTimeoutMS": int(seconds * 1000)}


def _client(cls: Any, uri: str, kwargs: dict[str, Any]) -> Any:
    options = client_options(uri, kwargs)  # (its own ConfigurationError, not wrapped)
    try:
        return cls(uri, **options)
    except (PyMongoError, ValueError, TypeError) as exc:
        # a malformed URI, an SRV record that does not resolve, a port past 65535
        # (pymongo's ValueError), an option of the wrong type
        raise ConfigurationError(
            f"cannot use the MongoDB URI {reachability.redact(uri)!r}: {exc}"
        ) from exc


def connect(
    uri: str | None = None,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    check: bool = True,
    **kwargs: Any,
) -> MongoClient[dict[str, Any]]:
    """A ``MongoClient`` on ``uri``, ``MONGODB_URI``, or the embedded engine for ``data_dir``.

    ``check`` (default): wait now until the driver has found a writable server, at most
    the server-selection timeout (``ACCORD_SERVER_SELECTION_TIMEOUT``, 5 s), and raise
    :class:`~accord.errors.DatabaseUnreachable` naming the hosts if none answers.
    ``kwargs`` go to ``MongoClient``.
    """
    client: MongoClient[dict[str, Any]] = _client(MongoClient, resolve_uri(uri, data_dir), kwargs)
    if check:
        try:
            ensure_reachable(client)
        except BaseException:
            client.close()
            raise
    return client


def connect_async(
    uri: str | None = None, *, data_dir: str | os.PathLike[str] | None = None, **kwargs: Any
) -> AsyncMongoClient[dict[str, Any]]:
    """The ``AsyncMongoClient`` twin of :func:`connect` (pymongo's native async API). It
    cannot wait here (no loop): accord's first operation on it checks the server instead,
    within the same server-selection timeout."""
    return _client(AsyncMongoClient, resolve_uri(uri, data_dir), kwargs)  # type: ignore[no-any-return]


def running_engines() -> list[dict[str, Any]]:
    """The embedded engines running on this machine for this user: ``dbpath``, ``host``,
    ``port`` and ``pid`` of each, by data directory. Entries of engines that died without
    stopping (SIGKILL) are dropped from the list on the way."""
    running = []
    for record in discovery.listed_engines():
        found = read_lock(Path(record["dbpath"]))
        if found and found[0] == record.get("pid"):
            running.append({k: record[k] for k in ("dbpath", "host", "port", "pid")})
        elif found is None:  # nothing serves that directory any more: a stale entry
            with contextlib.suppress(OSError):
                Path(record["entry"]).unlink()
    return sorted(running, key=lambda r: r["dbpath"])


def stop_engine(data_dir: str | os.PathLike[str], timeout: float = 10.0) -> bool:
    """Stop the engine serving ``data_dir`` (SIGTERM, then wait). False if none was running."""
    directory = Path(data_dir).resolve()
    found = read_lock(directory)
    if not found:
        return False
    pid = found[0]
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read_lock(directory) is None:
            return True
        time.sleep(0.05)
    raise EngineStartError(
        f"engine pid {pid} did not stop within {timeout}s; the end of its log "
        f"({directory / ENGINE_LOG}): {_log_tail(directory) or '(empty)'}"
    )


def _withdraw(proc: subprocess.Popen[bytes]) -> None:
    """Stop an engine we spawned that lost the race to another starter's. It may still be
    starting (a second or more under load): left alone it would take the data directory
    over once the winner stops, an engine nobody was told about."""
    if proc.poll() is not None:
        return  # it already found the directory taken (exit code 2)
    proc.terminate()  # before its handler is installed SIGTERM ends it; after, it stops
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _probe_port(host: str, port: int) -> None:
    """Raise :class:`~accord.errors.PortInUseError` if ``host:port`` is taken now. The
    engine checks again when it binds (another process may take the port in between); this
    only answers the common case without starting a process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the engine binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"the embedded engine could not start: cannot listen on {host}:{port}: "
                    f"address already in use (another accord engine, or a mongod?). Pick "
                    f"another --port, or --port 0 for any free one; `accord engine ls` "
                    f"lists running engines."
                ) from exc
            # anything else (an address not of this machine...): the engine says it


def _start_failed(directory: Path, since: int, code: int) -> EngineStartError:
    """The error for an engine process that exited with ``code`` before it listened: its
    own ``error: ...`` line (what it wrote to the log from offset ``since``)."""
    try:
        with open(directory / ENGINE_LOG, "rb") as f:
            f.seek(since)
            written = f.read().decode(errors="replace")
    except OSError:
        written = ""
    reasons = [
        line[len("error: ") :] for line in written.splitlines() if line.startswith("error: ")
    ]
    if reasons:
        reason = reasons[-1]
        cls = PortInUseError if "address already in use" in reason else EngineStartError
        return cls(f"the embedded engine could not start: {reason}")
    return EngineStartError(
        f"the embedded engine exited with code {code} before it listened; the end of its "
        f"log ({directory / ENGINE_LOG}): {written.strip()[-400:] or '(empty)'}"
    )


def _log_tail(directory: Path, chars: int = 400) -> str:
    """The last ``chars`` characters of the engine log in ``directory`` ('' if none)."""
    try:
        return (directory / ENGINE_LOG).read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""
